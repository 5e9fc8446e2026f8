package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// Both variants work unchanged with a *redis.ClusterClient: every key and
// channel of a semaphore is in one slot (names with braces included), the
// scripts run (SPUBLISH inside Lua included), and a blocked Acquire is woken
// by the sharded pub/sub notice of a release made by another client.
func TestClusterSmoke(t *testing.T) {
	redistest.CheckLeaks(t)
	cl := redistest.StartCluster(t, 3, 1)
	cc := cl.Client(t)
	ctx := redistest.Ctx(t, 60*time.Second)

	for _, v := range variants {
		for _, suffix := range []string{"plain", "a{b}c", "}x{", "{}", "{", "%7B"} {
			name := redistest.Name(t) + "-" + v.name + "-" + suffix
			t.Run(v.name+"/"+suffix, func(t *testing.T) {
				assertOneSlot(t, ctx, cc, name)
				s := v.new(t, cc, name, 2, opts{LeaseTTL: 5 * time.Second})
				a, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				b, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if a.Slot() == b.Slot() || b.Token() <= a.Token() {
					t.Fatalf("leases (slot %d, token %d) and (slot %d, token %d)", a.Slot(), a.Token(), b.Slot(), b.Token())
				}
				if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatalf("third TryAcquire: %v, want ErrNoSlot", err)
				}
				expectHolders(t, ctx, s, a.ID(), b.ID())
				// The keys that exist live on one node: the one owning the slot.
				have, err := keysOf(ctx, cc, name)
				if err != nil || len(have) == 0 {
					t.Fatalf("keys %v, %v", have, err)
				}
				for _, l := range []redsem.Lease{a, b} {
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				expectHolders(t, ctx, s)
			})
		}
	}

	// The scripts run as functions on a cluster: the library is loaded on
	// every master, and semaphores whose keys live on each master are
	// served with FCALL there.
	t.Run("functions", func(t *testing.T) {
		var names []string
		masters := map[string]bool{}
		for i := 0; len(masters) < 3 && i < 100; i++ {
			name := fmt.Sprintf("%s-fn-%d", redistest.Name(t), i)
			m, err := cc.MasterForKey(ctx, core.KeysFor(core.DefaultPrefix, name).List[0])
			if err != nil {
				t.Fatal(err)
			}
			if !masters[m.Options().Addr] {
				masters[m.Options().Addr] = true
				names = append(names, name)
			}
		}
		cycle := func(s redsem.Semaphore) {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var sems []redsem.Semaphore
		for _, name := range names {
			s := variants[0].new(t, cc, name, 2, opts{})
			sems = append(sems, s)
			cycle(s)
		}
		marker(t, sems[0], lua.Acquire) // waits until the client's choice is made
		if m := core.EngineOf(sems[0]).ScriptMode(); m != "fcall" {
			t.Fatalf("script mode %q on a Redis 7 cluster, want fcall", m)
		}
		lib, _ := lua.Library()
		calls := map[string]int64{}
		var mu sync.Mutex // ForEachMaster calls its function on each master at once
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			libs, err := m.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib}).Result()
			if err != nil || len(libs) != 1 {
				return fmt.Errorf("master %s: libraries %v, %v; want %s", m.Options().Addr, libs, err, lib)
			}
			n := fcalls(ctx, m)
			mu.Lock()
			calls[m.Options().Addr] = n
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, s := range sems {
			cycle(s)
		}
		for addr, before := range calls {
			m := redis.NewClient(&redis.Options{Addr: addr})
			after := fcalls(ctx, m)
			_ = m.Close()
			if after < before+2 {
				t.Errorf("master %s served %d FCALLs for one acquire and release of a semaphore it owns, want 2", addr, after-before)
			}
		}
	})

	for _, v := range variants {
		t.Run(v.name+"/wakeup", func(t *testing.T) {
			name := redistest.Name(t)
			// A fallback and a lease far longer than the test's bound: only
			// the release notice can wake the waiter in time. The holder is a
			// separate semaphore value, so the waiter cannot be woken by the
			// release reply in its own process either.
			o := opts{LeaseTTL: 60 * time.Second, QueueTTL: 120 * time.Second, Fallback: 60 * time.Second}
			holder := v.new(t, cc, name, 1, o)
			waiter := v.new(t, cc, name, 1, o)
			l, err := holder.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := acquireAsync(ctx, waiter)
			waitBlocked(t, ctx, cc, waiter, v.fair, name)
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			w := await(t, got, 20*time.Second, "waiter after release")
			if w.Token() <= l.Token() {
				t.Fatalf("token %d not above %d", w.Token(), l.Token())
			}
			if err := w.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}

	for _, v := range variants {
		t.Run(v.name+"/failover", func(t *testing.T) {
			if testing.Short() {
				t.Skip("long fault test; skipped with -short")
			}
			clusterFailover(t, ctx, cl, cc, v)
		})
	}
}

// clusterFailover runs workers on one semaphore while the primary owning its
// slot is replaced by its replica (CLUSTER FAILOVER, which loses no write).
func clusterFailover(t *testing.T, ctx context.Context, cl *redistest.Cluster, cc *redis.ClusterClient, v variant) {
	name := redistest.Name(t)
	s := v.new(t, cc, name, 2, opts{LeaseTTL: 2 * time.Second, QueueTTL: time.Second, Fallback: 200 * time.Millisecond})
	slot, err := cc.ClusterKeySlot(ctx, core.KeysFor(core.DefaultPrefix, name).List[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	runThroughFailover(t, ctx, s, 2, true, func() { cl.Failover(t, int(slot)) })
}

// runThroughFailover runs workers that acquire and release s while
// failover() runs: calls may fail during the switch, but tokens after it
// are above all tokens before it and the workers acquire again afterwards.
// With strict (a failover that loses no write) never more than limit may
// hold at once; otherwise the peak is only logged.
func runThroughFailover(t *testing.T, ctx context.Context, s redsem.Semaphore, limit int, strict bool, failover func()) {
	var (
		mu                sync.Mutex
		active, peak      int
		phase             atomic.Int32 // 1 once the failover has settled
		maxBefore         int64
		afterOK, errsSeen int
		lost              int
		firstErr          error
		bad               []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
	defer halt() // also when the test fails half-way
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := phase.Load()
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l, err := s.Acquire(actx)
				cancel()
				pEnd := phase.Load()
				mu.Lock()
				if err != nil {
					errsSeen++
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
					continue
				}
				active++
				peak = max(peak, active)
				// Compare only a lease returned before the switch settled
				// with one requested after it: a lease requested before
				// and granted after may be granted after one requested
				// later, and then rightly has the larger token.
				switch {
				case p == 0 && pEnd == 0:
					maxBefore = max(maxBefore, l.Token())
				case p == 1:
					afterOK++
					if l.Token() <= maxBefore {
						bad = append(bad, fmt.Sprintf("token %d after failover not above %d", l.Token(), maxBefore))
					}
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				active--
				mu.Unlock()
				// May fail during the switch: the slot then expires.
				if err := l.Release(ctx); errors.Is(err, redsem.ErrLeaseLost) {
					mu.Lock()
					lost++
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // let the workers run before the switch
	failover()
	phase.Store(1)
	eventually(t, 30*time.Second, "acquisitions after the failover", func() error {
		mu.Lock()
		defer mu.Unlock()
		if afterOK < 10 {
			return errorf("%d acquisitions after the failover", afterOK)
		}
		return nil
	})
	halt()
	mu.Lock()
	defer mu.Unlock()
	if strict && peak > limit {
		t.Fatalf("%d holders at once, limit %d", peak, limit)
	}
	if len(bad) > 0 {
		t.Fatal(bad[0])
	}
	t.Logf("peak %d holders (limit %d), %d errors during the switch (first: %v), %d leases lost, %d acquisitions after it",
		peak, limit, errsSeen, firstErr, lost, afterOK)
}

// waitBlocked waits until a blocked Acquire is known to Redis: queued (fair)
// or subscribed to the freed-slot channel (unfair).
func waitBlocked(t *testing.T, ctx context.Context, c redis.UniversalClient, s redsem.Semaphore, fair bool, name string) {
	t.Helper()
	if fair {
		eventually(t, 10*time.Second, "waiter queued", func() error {
			if n, err := waitersOf(ctx, s); err != nil || n != 1 {
				return errorf("%d waiters, %v", n, err)
			}
			return nil
		})
		return
	}
	ch := core.KeysFor(core.DefaultPrefix, name).Free
	eventually(t, 10*time.Second, "waiter subscribed", func() error {
		n, err := shardSubscribers(ctx, c, ch)
		if err != nil || n < 1 {
			return errorf("%d subscribers, %v", n, err)
		}
		return nil
	})
}

// shardSubscribers counts the subscribers of channel: on a cluster the
// sharded ones on the node that serves it (the engine uses SSUBSCRIBE and
// the scripts SPUBLISH there), elsewhere plain ones (SUBSCRIBE, PUBLISH).
func shardSubscribers(ctx context.Context, c redis.UniversalClient, channel string) (int64, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		v, err := c.PubSubNumSub(ctx, channel).Result()
		return v[channel], err
	}
	m, err := cc.MasterForKey(ctx, channel)
	if err != nil {
		return 0, err
	}
	v, err := m.PubSubShardNumSub(ctx, channel).Result()
	return v[channel], err
}

// assertOneSlot checks with CLUSTER KEYSLOT that every key and channel of
// the semaphore name hashes to one slot, and that it is not the slot of the
// same name without the hash tag's escaping (i.e. braces did not cut the tag).
func assertOneSlot(t *testing.T, ctx context.Context, cc *redis.ClusterClient, name string) {
	t.Helper()
	k := core.KeysFor(core.DefaultPrefix, name)
	all := append(append([]string(nil), k.List...), k.Chan, k.Free, k.Chan+":s:0123456789abcdef")
	want, err := cc.ClusterKeySlot(ctx, all[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := cc.ClusterKeySlot(ctx, "{"+core.EscapeTag(name)+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want != tag {
		t.Fatalf("key %s in slot %d, but its tag {%s} is in slot %d", all[0], want, core.EscapeTag(name), tag)
	}
	for _, key := range all[1:] {
		got, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s in slot %d, %s in slot %d", all[0], want, key, got)
		}
	}
}

// fcalls returns how many FCALLs server c has run.
func fcalls(ctx context.Context, c *redis.Client) int64 {
	n, _ := commandCalls(ctx, c, "fcall")
	return n
}

// commandCalls returns how many calls of the commands cmds server c has
// run in all, from INFO commandstats.
func commandCalls(ctx context.Context, c *redis.Client, cmds ...string) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range cmds {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				sum += n
			}
		}
	}
	return sum, nil
}
