package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redisproc"
)

// SentinelMaster is the master name under which StartSentinel monitors.
const SentinelMaster = "redistest"

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors primary as SentinelMaster (quorum 1, down after 1s), stopped when
// the test ends. It waits until the sentinel knows wantReplicas replicas,
// so that a failover can be forced at once.
func StartSentinel(t testing.TB, primary *Server, wantReplicas int) *Server {
	t.Helper()
	bin, err := redisproc.Binary()
	if err != nil {
		t.Fatalf("%s (%v)", HowToGetRedis, err)
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		t.Fatal(err)
	}
	host, port := splitAddr(primary.Addr)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("sentinel resolve-hostnames no\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 5000\n",
		SentinelMaster, host, port)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var s *Server
	for attempt := 0; attempt < 5; attempt++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s = &Server{Addr: "127.0.0.1:" + strconv.Itoa(p), port: p, dir: dir}
		s.args = []string{bin, conf, "--sentinel", "--port", strconv.Itoa(p), "--bind", "127.0.0.1",
			"--dir", dir, "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log")}
		if err = s.launchLocked(); err == nil {
			break
		}
		s = nil
	}
	if s == nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("redistest: sentinel did not start")
	}
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	err = waitFor(ctx, func() (bool, error) {
		reps, err := sc.Replicas(ctx, SentinelMaster).Result()
		return err == nil && len(reps) >= wantReplicas, err
	})
	if err != nil {
		t.Fatalf("redistest: sentinel does not see %d replicas: %v", wantReplicas, err)
	}
	return s
}
