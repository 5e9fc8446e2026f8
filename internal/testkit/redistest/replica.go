package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a redis-server replicating s (stopped when the test
// ends) and waits until the replication link is up. It first sets s's
// repl-diskless-sync-delay to 0: Redis 7 otherwise waits 5 s for more
// replicas before the first full sync.
func (s *Server) StartReplica(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pc := redis.NewClient(s.Options())
	defer pc.Close()
	if err := pc.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("redistest: primary %s: %v", s.Addr, err)
	}
	host, port := splitAddr(s.Addr)
	r := Start(t, "--replicaof", host, port, "--repl-diskless-sync-delay", "0") // the same once promoted
	c := redis.NewClient(r.Options())
	defer c.Close()
	err := waitFor(ctx, func() (bool, error) {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up"), err
	})
	if err != nil {
		t.Fatalf("redistest: replica %s of %s: link not up: %v", r.Addr, s.Addr, err)
	}
	return r
}
