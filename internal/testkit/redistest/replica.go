package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a redis-server replicating s (stopped when the test
// ends) and waits until the replication link is up.
func (s *Server) StartReplica(t testing.TB) *Server {
	t.Helper()
	host, port := splitAddr(s.Addr)
	r := Start(t, "--replicaof", host, port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
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
