package fair_test

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// commandStats returns the calls per command from INFO commandstats.
func commandStats(t *testing.T, ctx context.Context, c redis.UniversalClient) map[string]int {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

func scriptCalls(st map[string]int) int {
	return st["evalsha"] + st["eval"] + st["evalsha_ro"] + st["fcall"] + st["fcall_ro"]
}

// When a slot frees, only the waiter it is granted to is woken: one message
// to one session, no broadcast, and no other waiter runs a script.
func TestWakeupsTargeted(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	srv := redistest.Start(t)
	name := redistest.Name(t)
	const instances, perInstance = 3, 4
	admin := srv.Client(t)
	var sems []*fair.Semaphore
	for i := 0; i < instances; i++ {
		sems = append(sems, newSem(t, srv.Client(t), name, 1, quiet))
	}
	holder, err := sems[0].TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var chans []<-chan result
	for i := 0; i < instances*perInstance; i++ {
		chans = append(chans, acquireAsync(ctx, sems[(i+1)%instances]))
		waitWaiters(t, ctx, sems[0], i+1)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Messages are counted by channel: grants go to one session's channel,
	// broadcasts to the freed-slot channel. A marker message on a channel
	// of the same pattern flushes what was published before it.
	keys := keysOf(name)
	watch := admin.PSubscribe(ctx, keys.Chan+"*")
	defer watch.Close()
	if _, err := watch.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(marker string) (msgs, broadcasts int) {
		t.Helper()
		if err := admin.Publish(ctx, keys.Chan+":marker", marker).Err(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := watch.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.Channel == keys.Chan+":marker" && m.Payload == marker:
				return msgs, broadcasts
			case m.Channel == keys.Free:
				broadcasts++
			case strings.HasPrefix(m.Channel, keys.Chan+":s:"):
				msgs++
			}
		}
	}
	count("start")
	for k := 0; k < 3; k++ {
		before := commandStats(t, ctx, admin)
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		holder = got(t, chans[k], 10*time.Second)
		after := commandStats(t, ctx, admin)
		msgs, broadcasts := count(strconv.Itoa(k))
		scripts := scriptCalls(after) - scriptCalls(before)
		t.Logf("handoff %d: %d grant messages, %d broadcasts, %d script calls", k, msgs, broadcasts, scripts)
		if msgs != 1 || broadcasts != 0 {
			t.Fatalf("handoff %d woke %d sessions (+%d broadcasts), want exactly 1", k, msgs, broadcasts)
		}
		// The release itself, plus at most one heartbeat per session (a
		// session claims its grant): never one call per waiter.
		if scripts > 1+instances {
			t.Fatalf("handoff %d cost %d script calls with %d waiters", k, scripts, instances*perInstance-k)
		}
		for _, ch := range chans[k+1:] {
			pending(t, ch, "a waiter further back")
		}
	}
	// Let the rest through and clean up.
	for k := 3; k < len(chans); k++ {
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		holder = got(t, chans[k], 10*time.Second)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, ctx, admin, name)
}

// Liveness of waiting costs one heartbeat per process (session), not one per
// waiter: 30 waiters in 2 sessions heart-beating every 100ms cost about 20
// script calls per second, not 300.
func TestHeartbeatPerSession(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 30*time.Second)
	srv := redistest.Start(t)
	name := redistest.Name(t)
	admin := srv.Client(t)
	const sessions, waiters = 2, 30
	opts := fair.Options{QueueTTL: 10 * time.Second, FallbackInterval: 100 * time.Millisecond, LeaseTTL: time.Minute}
	holderSem := newSem(t, srv.Client(t), name, 1, opts)
	holder, err := holderSem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sems []*fair.Semaphore
	for i := 0; i < sessions; i++ {
		sems = append(sems, newSem(t, srv.Client(t), name, 1, opts))
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func(s *fair.Semaphore) {
			defer wg.Done()
			if l, err := s.Acquire(wctx); err == nil {
				_ = l.Release(ctx)
			}
		}(sems[i%sessions])
	}
	waitWaiters(t, ctx, holderSem, waiters)
	before := commandStats(t, ctx, admin)
	start := time.Now()
	var window time.Duration
	// Measure over at least one second of waiting.
	waitFor(t, 10*time.Second, "a one second window", func() (bool, error) {
		window = time.Since(start)
		return window >= time.Second, nil
	})
	after := commandStats(t, ctx, admin)
	calls := scriptCalls(after) - scriptCalls(before)
	beats := float64(window) / float64(100*time.Millisecond)
	t.Logf("%d script calls in %v with %d waiters in %d sessions (%.0f heartbeat periods)",
		calls, window.Round(time.Millisecond), waiters, sessions, beats)
	if limit := int(2*beats*sessions) + 2*sessions; calls > limit {
		t.Fatalf("%d script calls in %v: more than one heartbeat per session per period (bound %d)", calls, window, limit)
	}
	if calls < sessions {
		t.Fatalf("only %d script calls in %v: sessions do not heart-beat", calls, window)
	}
	if st := status(t, ctx, holderSem); len(st.Waiters) != waiters {
		t.Fatalf("waiters lost their places: %d left", len(st.Waiters))
	}
	cancel()
	wg.Wait()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The abandoned waiters leave by detached undos.
	waitFor(t, 10*time.Second, "the undos of the abandoned waiters", func() (bool, error) {
		return raw(t, ctx, admin, name) == rawCounts{}, nil
	})
	checkClean(t, ctx, admin, name)
}

// Pub/sub is at-most-once. With every grant message lost (all pub/sub
// connections killed as the slots free, and again and again while the queue
// drains) waiters still get their slots, in order, through the fallback
// heartbeat. This checks liveness, not speed: the bound is generous.
func TestLostMessagesFallback(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t, 40*time.Second)
	srv := redistest.Start(t)
	name := redistest.Name(t)
	admin := srv.Client(t)
	const limit, instances, perInstance = 2, 3, 3
	opts := fair.Options{FallbackInterval: 200 * time.Millisecond}
	var sems []*fair.Semaphore
	for i := 0; i < instances; i++ {
		sems = append(sems, newSem(t, srv.Client(t), name, limit, opts))
	}
	var holders []string
	for i := 0; i < limit; i++ {
		l, err := sems[0].TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, l.ID())
	}
	var mu sync.Mutex
	var admitted []redsem.Lease
	var wg sync.WaitGroup
	n := instances * perInstance
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(s *fair.Semaphore) {
			defer wg.Done()
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			admitted = append(admitted, l)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}(sems[i%instances])
		waitWaiters(t, ctx, sems[0], i+1)
	}
	arrival := waiterIDs(t, status(t, ctx, sems[0]))

	// Keep cutting every pub/sub connection while the queue drains.
	stop := make(chan struct{})
	killed := make(chan int, 1)
	go func() {
		kills := 0
		defer func() { killed <- kills }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			if admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err() == nil {
				kills++
			}
		}
	}()
	start := time.Now()
	releaseLosingMessages(t, ctx, admin, name, limit, holders...)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waiters did not all get a slot within 10s with messages lost")
	}
	close(stop)
	t.Logf("%d waiters served in %v while pub/sub connections were killed %d times",
		n, time.Since(start).Round(time.Millisecond), <-killed)
	sort.Slice(admitted, func(a, b int) bool { return admitted[a].Token() < admitted[b].Token() })
	for i, l := range admitted {
		if l.ID() != arrival[i] {
			t.Fatalf("admission %d was %s, want %s (arrival order)", i, l.ID(), arrival[i])
		}
	}
	checkClean(t, ctx, admin, name)
}
