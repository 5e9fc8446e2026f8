package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redisproc"
)

// SentinelMaster is the master name under which StartSentinel monitors.
const SentinelMaster = "redistest"

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors primary as SentinelMaster (quorum 1, down after 1s), stopped when
// the test ends. The primary's replicas connected now are in its
// configuration (known-replica), so that it need not wait for the primary's
// next INFO (every 10 s) to learn them. It waits until the sentinel has
// read wantReplicas replicas' INFO and found their links up, so that a
// failover can be forced at once.
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
	for _, r := range replicasOf(t, primary) {
		h, p := splitAddr(r)
		text += fmt.Sprintf("sentinel known-replica %s %s %s\n", SentinelMaster, h, p)
	}
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
		ready := 0
		for _, r := range reps {
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				ready++
			}
		}
		return err == nil && ready >= wantReplicas, err
	})
	if err != nil {
		t.Fatalf("redistest: sentinel does not see %d replicas: %v", wantReplicas, err)
	}
	return s
}

// replicasOf lists the addresses of the replicas connected to primary, from
// its INFO replication ("slave0:ip=...,port=...,...").
func replicasOf(t testing.TB, primary *Server) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewClient(primary.Options())
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("redistest: replicas of %s: %v", primary.Addr, err)
	}
	var addrs []string
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "slave") || !strings.Contains(line, ":ip=") {
			continue
		}
		var ip, port string
		for _, kv := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		if ip != "" && port != "" {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	return addrs
}
