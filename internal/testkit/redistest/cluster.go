package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a local Redis Cluster owned by a test: redis-server processes
// started with --cluster-enabled yes on free loopback ports, the 16384 slots
// split evenly over the primaries by the helper.
type Cluster struct {
	// Primaries are the nodes that own slots, Primaries[i] owning the i-th
	// contiguous range; Replicas[i] are Primaries[i]'s replicas.
	Primaries []*Server
	Replicas  [][]*Server
	ids       map[*Server]string
	bus       map[*Server]int // cluster bus port
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// StartCluster starts a cluster of primaries nodes, each with
// replicasPerPrimary replicas, and waits until every node reports
// cluster_state:ok and every replica is in sync. The nodes are stopped
// when the test ends.
func StartCluster(t testing.TB, primaries, replicasPerPrimary int) *Cluster {
	t.Helper()
	if primaries < 1 || replicasPerPrimary < 0 {
		t.Fatalf("redistest: StartCluster(%d, %d): need at least one primary", primaries, replicasPerPrimary)
	}
	c := &Cluster{ids: map[*Server]string{}, bus: map[*Server]int{}}
	start := func() *Server {
		busPort, err := FreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(busPort), "--cluster-node-timeout", "2000",
			"--cluster-require-full-coverage", "yes",
			"--repl-diskless-sync-delay", "0") // not 5 s before a replica's first sync
		c.bus[s] = busPort
		return s
	}
	for i := 0; i < primaries; i++ {
		c.Primaries = append(c.Primaries, start())
		var reps []*Server
		for j := 0; j < replicasPerPrimary; j++ {
			reps = append(reps, start())
		}
		c.Replicas = append(c.Replicas, reps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("redistest: forming cluster: %v", err)
	}
	return c
}

// Nodes returns every node, primaries first.
func (c *Cluster) Nodes() []*Server {
	nodes := append([]*Server(nil), c.Primaries...)
	for _, reps := range c.Replicas {
		nodes = append(nodes, reps...)
	}
	return nodes
}

// Addrs returns the address of every node.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	return addrs
}

// ID returns the cluster node id of n.
func (c *Cluster) ID(n *Server) string { return c.ids[n] }

// Options returns go-redis cluster options for the nodes: loopback
// addresses, short timeouts, contexts honoured.
func (c *Cluster) Options() *redis.ClusterOptions {
	return clientOptions(c.Addrs()...).Cluster()
}

// Client returns a new cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	return closeAtEnd(t, redis.NewClusterClient(c.Options()))
}

// form assigns slots, introduces the nodes to each other, attaches the
// replicas and waits for a healthy cluster.
func (c *Cluster) form(ctx context.Context) error {
	nodes := c.Nodes()
	clients := map[*Server]*redis.Client{}
	for _, n := range nodes {
		cl := redis.NewClient(n.Options())
		defer cl.Close()
		clients[n] = cl
		id, err := cl.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %w", n.Addr, err)
		}
		c.ids[n] = id
	}
	per := clusterSlots / len(c.Primaries)
	for i, p := range c.Primaries {
		lo, hi := i*per, (i+1)*per-1
		if i == len(c.Primaries)-1 {
			hi = clusterSlots - 1
		}
		if err := clients[p].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", p.Addr, lo, hi, err)
		}
	}
	first := nodes[0]
	host, port := splitAddr(first.Addr)
	for _, n := range nodes[1:] {
		if err := clients[n].Do(ctx, "CLUSTER", "MEET", host, port, c.bus[first]).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER MEET: %w", n.Addr, err)
		}
	}
	// Every node must know every other before a replica can follow its primary.
	if err := waitFor(ctx, func() (bool, error) {
		for _, n := range nodes {
			s, err := clients[n].Do(ctx, "CLUSTER", "NODES").Text()
			if err != nil {
				return false, err
			}
			if strings.Count(strings.TrimSpace(s), "\n")+1 != len(nodes) || strings.Contains(s, "handshake") {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("nodes did not meet: %w", err)
	}
	for i, reps := range c.Replicas {
		for _, r := range reps {
			if err := clients[r].Do(ctx, "CLUSTER", "REPLICATE", c.ids[c.Primaries[i]]).Err(); err != nil {
				return fmt.Errorf("%s: CLUSTER REPLICATE: %w", r.Addr, err)
			}
		}
	}
	return waitFor(ctx, func() (bool, error) {
		for _, n := range nodes {
			info, err := clients[n].Do(ctx, "CLUSTER", "INFO").Text()
			if err != nil {
				return false, err
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(nodes))) {
				return false, nil
			}
		}
		for _, reps := range c.Replicas {
			for _, r := range reps {
				info, err := clients[r].Info(ctx, "replication").Result()
				if err != nil {
					return false, err
				}
				if !strings.Contains(info, "master_link_status:up") {
					return false, nil
				}
			}
		}
		return true, nil
	})
}

// Failover makes a replica of the primary that owns slot take over (CLUSTER
// FAILOVER, a coordinated switch that loses no acknowledged write) and waits
// until every node agrees. It returns the new primary.
func (c *Cluster) Failover(t testing.TB, slot int) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	idx := slot / (clusterSlots / len(c.Primaries))
	if idx >= len(c.Primaries) {
		idx = len(c.Primaries) - 1
	}
	if len(c.Replicas[idx]) == 0 {
		t.Fatalf("redistest: primary %s has no replica to fail over to", c.Primaries[idx].Addr)
	}
	rep := c.Replicas[idx][0]
	rc := redis.NewClient(rep.Options())
	defer rc.Close()
	promoted := func() (bool, error) {
		for _, n := range c.Nodes() {
			cl := redis.NewClient(n.Options())
			s, err := cl.Do(ctx, "CLUSTER", "NODES").Text()
			_ = cl.Close()
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(s, "\n") {
				if strings.HasPrefix(line, c.ids[rep]+" ") && !strings.Contains(line, "master") {
					return false, nil
				}
			}
		}
		return true, nil
	}
	// A manual failover that does not complete in 5s (a replica slow to
	// catch up on a loaded machine) is aborted by Redis: ask again.
	c.promote(t, ctx, idx, rc, 7*time.Second, promoted, func(int) []any { return []any{"CLUSTER", "FAILOVER"} })
	return rep
}

// promote sends the failover command that args gives for each attempt to
// the replica's client rc, up to four times, until settled holds (each
// attempt waits at most wait), then swaps the replica in as primary idx. A
// replica that became primary by the cluster's own failover (of a dead
// primary, after the node timeout) is not asked.
func (c *Cluster) promote(t testing.TB, ctx context.Context, idx int, rc *redis.Client, wait time.Duration,
	settled func() (bool, error), args func(attempt int) []any) {
	t.Helper()
	old, rep := c.Primaries[idx], c.Replicas[idx][0]
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if ok, _ := settled(); ok {
			break // the cluster's own failover (a dead primary) was quicker
		}
		err = rc.Do(ctx, args(attempt)...).Err()
		if err != nil && !strings.Contains(err.Error(), "to a replica") {
			t.Fatalf("redistest: %v on %s: %v", args(attempt), rep.Addr, err)
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		err = waitFor(actx, settled)
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("redistest: failover to %s did not settle: %v", rep.Addr, err)
	}
	c.Primaries[idx] = rep
	c.Replicas[idx][0] = old
}

// KillPrimary kills primary idx (SIGKILL: no goodbye to the cluster),
// makes its first replica take over (CLUSTER FAILOVER FORCE: the other
// primaries vote, the dead one is not asked) and waits until every live
// node agrees and reports cluster_state:ok. It returns the new primary;
// the killed node is left dead (the test's end stops it).
func (c *Cluster) KillPrimary(t testing.TB, idx int) *Server {
	t.Helper()
	if len(c.Replicas[idx]) == 0 {
		t.Fatalf("redistest: primary %s has no replica to take over", c.Primaries[idx].Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	old, rep := c.Primaries[idx], c.Replicas[idx][0]
	old.Kill(t)
	rc := redis.NewClient(rep.Options())
	defer rc.Close()
	var live []*Server
	for _, n := range c.Nodes() {
		if n != old {
			live = append(live, n)
		}
	}
	settled := func() (bool, error) {
		for _, n := range live {
			cl := redis.NewClient(n.Options())
			nodes, err := cl.Do(ctx, "CLUSTER", "NODES").Text()
			info, ierr := cl.Do(ctx, "CLUSTER", "INFO").Text()
			_ = cl.Close()
			if err != nil || ierr != nil {
				return false, nil // a node busy with the election: ask again
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return false, nil
			}
			for _, line := range strings.Split(nodes, "\n") {
				if strings.HasPrefix(line, c.ids[rep]+" ") && !strings.Contains(line, "master") {
					return false, nil
				}
			}
		}
		return true, nil
	}
	// FORCE: the replica starts an election at once, without its dead
	// primary; TAKEOVER (no vote) if that did not settle twice.
	c.promote(t, ctx, idx, rc, 8*time.Second, settled, func(attempt int) []any {
		if attempt > 1 {
			return []any{"CLUSTER", "FAILOVER", "TAKEOVER"}
		}
		return []any{"CLUSTER", "FAILOVER", "FORCE"}
	})
	return rep
}

func splitAddr(addr string) (string, string) {
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}

// waitFor polls cond every 20ms until it holds, fails, or ctx ends.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
			}
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
