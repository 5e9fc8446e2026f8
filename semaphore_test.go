package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// opts are the options both variants share in these tests.
type opts struct {
	LeaseTTL         time.Duration
	DisableAutoRenew bool
	Observer         redsem.Observer
}

type variant struct {
	name string
	new  func(c redis.UniversalClient, name string, limit int, o opts) (redsem.Semaphore, error)
}

var variants = []variant{
	{"unfair", func(c redis.UniversalClient, name string, limit int, o opts) (redsem.Semaphore, error) {
		s, err := unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew, Observer: o.Observer})
		if err != nil {
			return nil, err
		}
		return s, nil
	}},
	{"fair", func(c redis.UniversalClient, name string, limit int, o opts) (redsem.Semaphore, error) {
		s, err := fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew, Observer: o.Observer})
		if err != nil {
			return nil, err
		}
		return s, nil
	}},
}

// forEach runs f as a subtest for each variant.
func forEach(t *testing.T, f func(t *testing.T, v variant)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) { f(t, v) })
	}
}

func mustNew(t *testing.T, v variant, c redis.UniversalClient, name string, limit int, o opts) redsem.Semaphore {
	t.Helper()
	s, err := v.new(c, name, limit, o)
	if err != nil {
		t.Fatal(err)
	}
	if cl, ok := s.(interface{ Close() error }); ok {
		t.Cleanup(func() { _ = cl.Close() })
	}
	return s
}

func TestNewRejectsBadInput(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	var nilClient *redis.Client
	cases := []struct {
		desc   string
		client redis.UniversalClient
		name   string
		limit  int
		ttl    time.Duration
		field  string
	}{
		{"nil client", nil, "n", 1, 0, "client"},
		{"typed nil client", nilClient, "n", 1, 0, "client"},
		{"empty name", c, "", 1, 0, "name"},
		{"long name", c, strings.Repeat("x", 513), 1, 0, "name"},
		{"bad utf-8 name", c, "\xff", 1, 0, "name"},
		{"zero limit", c, "n", 0, 0, "limit"},
		{"negative limit", c, "n", -3, 0, "limit"},
		{"huge limit", c, "n", 1 << 21, 0, "limit"},
		{"negative ttl", c, "n", 1, -time.Second, "Options.LeaseTTL"},
		{"sub-ms ttl", c, "n", 1, time.Microsecond, "Options.LeaseTTL"},
	}
	forEach(t, func(t *testing.T, v variant) {
		for _, tc := range cases {
			s, err := v.new(tc.client, tc.name, tc.limit, opts{LeaseTTL: tc.ttl})
			var ce *redsem.ConfigError
			if s != nil || !errors.As(err, &ce) || !errors.Is(err, redsem.ErrInvalidConfig) {
				t.Errorf("%s: got (%v, %v), want a *ConfigError", tc.desc, s, err)
				continue
			}
			if ce.Field != tc.field {
				t.Errorf("%s: field %q, want %q (%v)", tc.desc, ce.Field, tc.field, err)
			}
			if !strings.HasPrefix(err.Error(), "redsem: ") {
				t.Errorf("%s: message %q lacks the package prefix", tc.desc, err)
			}
		}
	})
	if _, err := unfair.New(c, "n", 1, unfair.Options{KeyPrefix: "a{b"}); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Errorf("prefix with a brace: %v", err)
	}
	if _, err := fair.New(c, "n", 1, fair.Options{QueueTTL: -1}); !errors.Is(err, redsem.ErrInvalidConfig) {
		t.Errorf("negative QueueTTL: %v", err)
	}
}

// With Redis down, TryAcquire, Status and SetLimit fail at once; Acquire
// rides the outage out (a restart or failover looks the same) until its
// context ends, and then returns an error matching the deadline, within
// moments of it.
func TestRedisDownFailsWithinDeadline(t *testing.T) {
	port, err := redistest.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), ContextTimeoutEnabled: true})
	defer c.Close()
	forEach(t, func(t *testing.T, v variant) {
		s := mustNew(t, v, c, redistest.Name(t), 2, opts{})
		for _, op := range []string{"TryAcquire", "Acquire", "Status", "SetLimit"} {
			wait := 3 * time.Second
			if op == "Acquire" {
				wait = 300 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			start := time.Now()
			var err error
			switch op {
			case "TryAcquire":
				_, err = s.TryAcquire(ctx)
			case "Acquire":
				_, err = s.Acquire(ctx)
			case "Status":
				_, err = s.Status(ctx)
			case "SetLimit":
				err = s.SetLimit(ctx, 3)
			}
			took := time.Since(start)
			deadlineHit := ctx.Err() != nil
			cancel()
			if op == "Acquire" {
				// The connection error is joined in when a try failed
				// before the deadline (a try still dialing is abandoned).
				if !errors.Is(err, context.DeadlineExceeded) || took > wait+200*time.Millisecond {
					t.Errorf("Acquire with Redis down: %v after %v, want the deadline (%v)", err, took, wait)
				}
				if !errors.Is(err, redsem.ErrUnavailable) || strings.Contains(err.Error(), "\n") {
					t.Errorf("Acquire with Redis down: %q, want one line that matches ErrUnavailable", err)
				}
				continue
			}
			var netErr *net.OpError
			if err == nil || !errors.As(err, &netErr) {
				t.Errorf("%s with Redis down: got %v, want a connection error", op, err)
			}
			if deadlineHit {
				t.Errorf("%s with Redis down ran into the caller's deadline instead of failing: %v", op, err)
			}
		}
	})
}

// dialCounter is a go-redis hook that counts dial attempts.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TryAcquire never waits, also with Redis down on a client that retries
// (go-redis's default 3 retries per command, and 2 dial attempts per
// connection, 2 s apart): it returns an error matching ErrUnavailable once
// a dial failed, before go-redis dials again, with or without a deadline.
// (Issue 33: with go-redis's defaults, 5 dial attempts 100 ms apart, it
// took 3.4 s and 55 dials, 1.3 s and 46 with a deadline; now about a
// millisecond and 1-3 dials, its own and the first-use maxmemory-policy
// check's.)
func TestTryAcquireRedisDownDefaultClient(t *testing.T) {
	port, err := redistest.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	const dialRetry = 2 * time.Second
	forEach(t, func(t *testing.T, v variant) {
		t.Parallel()
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), DialerRetries: 2, DialerRetryTimeout: dialRetry})
		t.Cleanup(func() { _ = c.Close() })
		s := mustNew(t, v, c, redistest.Name(t), 2, opts{})
		dials := &dialCounter{}
		c.AddHook(dials)
		for _, deadline := range []time.Duration{0, time.Minute} {
			ctx := context.Background()
			if deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, deadline)
				defer cancel()
			}
			dials.n.Store(0)
			start := time.Now()
			_, err := s.TryAcquire(ctx)
			took := time.Since(start)
			t.Logf("deadline %v: TryAcquire returned after %v and %d dials: %v", deadline, took, dials.n.Load(), err)
			if !errors.Is(err, redsem.ErrUnavailable) || ctx.Err() != nil {
				t.Errorf("deadline %v: %v, want ErrUnavailable before the deadline", deadline, err)
			}
			if took >= dialRetry {
				t.Errorf("deadline %v: TryAcquire returned after %v, want before go-redis dials again (%v): it returns once a dial failed", deadline, took, dialRetry)
			}
		}
		_ = s.(interface{ Close() error }).Close()
		_ = c.Close()
		waitGone(t, "(*ConnPool).dialConn", "(*policyCheck).check")
	})
}

func TestLeaseLifecycle(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		s := mustNew(t, v, redistest.Client(t), redistest.Name(t), 2, opts{LeaseTTL: 3 * time.Second})
		if s.Name() == "" {
			t.Fatal("empty Name")
		}
		before := time.Now()
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := uuidParse(l.ID()); err != nil {
			t.Errorf("ID %q is not a UUID", l.ID())
		}
		if d := l.Deadline(); d.Before(before) || d.After(time.Now().Add(3*time.Second)) {
			t.Errorf("deadline %v not within (acquire start, now+TTL]", d)
		}
		d0 := l.Deadline()
		time.Sleep(5 * time.Millisecond)
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if !l.Deadline().After(d0) {
			t.Errorf("Renew did not move the deadline: %v -> %v", d0, l.Deadline())
		}
		if l.Err() != nil {
			t.Errorf("Err while held: %v", l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("second Release: %v", err)
		}
		if err := l.Renew(ctx); !errors.Is(err, redsem.ErrReleased) || errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Renew after Release: %v, want ErrReleased (not lost)", err)
		}
		if l.Err() != nil {
			t.Errorf("Err after Release: %v", l.Err())
		}
		st, err := s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 0 || st.Limit != 2 {
			t.Errorf("status after release: %+v", st)
		}
	})
}

// A holder that stops renewing loses its slot after the TTL and another
// client gets it; the lost lease reports it on Renew, Release, Done and Err.
func TestExpiredHolderLosesSlot(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		a := mustNew(t, v, redistest.Client(t), name, 1, opts{LeaseTTL: 200 * time.Millisecond, DisableAutoRenew: true})
		b := mustNew(t, v, redistest.Client(t), name, 1, opts{LeaseTTL: 5 * time.Second})
		la, err := a.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatalf("second holder admitted over the limit: %v", err)
		}
		lb, err := b.Acquire(ctx) // admitted once la expires
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().Before(la.Deadline()) {
			t.Fatalf("b admitted at %v, before a's deadline %v", time.Now(), la.Deadline())
		}
		if lb.Slot() != la.Slot() || lb.Token() <= la.Token() {
			t.Errorf("b slot %d token %d, a slot %d token %d", lb.Slot(), lb.Token(), la.Slot(), la.Token())
		}
		if err := la.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Renew after loss: %v", err)
		}
		select {
		case <-la.Done():
		default:
			t.Error("Done open after loss")
		}
		if !errors.Is(la.Err(), redsem.ErrLeaseLost) {
			t.Errorf("Err after loss: %v", la.Err())
		}
		if err := la.Release(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Release after loss: %v", err)
		}
		if err := la.Release(ctx); err != nil {
			t.Errorf("second Release after loss: %v", err)
		}
		_ = lb.Release(ctx)
	})
}

// The renewal timer keeps a lease alive well past its TTL: the test waits
// (polling, with a deadline) until the lease's deadline has moved three TTLs
// past the first one, so that the lease has outlived its first deadline by
// two TTLs, and checks that it was never lost on the way.
func TestAutoRenewKeepsLease(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		// Renewals come every TTL/3: a TTL of 600 ms leaves 400 ms of slack
		// for a renewal delayed by a loaded machine.
		const ttl = 600 * time.Millisecond
		s := mustNew(t, v, redistest.Client(t), redistest.Name(t), 1, opts{LeaseTTL: ttl})
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		target := l.Deadline().Add(3 * ttl)
		redistest.WaitFor(t, 10*time.Second, "the lease to be renewed three TTLs on", func() (bool, error) {
			select {
			case <-l.Done():
				return false, fmt.Errorf("lease lost despite auto-renew: %v", l.Err())
			default:
			}
			return l.Deadline().After(target), nil
		})
		// A renewal sets the deadline to at most now + TTL.
		if !time.Now().After(target.Add(-ttl)) {
			t.Fatal("deadline moved further than a renewal can")
		}
		if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatalf("slot free while renewed lease held: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLimitMismatchAndSetLimit(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		var events []redsem.Event
		var mu sync.Mutex
		obs := func(e redsem.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
		s2 := mustNew(t, v, redistest.Client(t), name, 2, opts{})
		s3 := mustNew(t, v, redistest.Client(t), name, 3, opts{Observer: obs})
		l, err := s2.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s3.TryAcquire(ctx)
		var me *redsem.LimitMismatchError
		if !errors.Is(err, redsem.ErrLimitMismatch) || !errors.As(err, &me) || me.Client != 3 || me.Established != 2 {
			t.Fatalf("got %v, want a mismatch naming 3 and 2", err)
		}
		if !strings.Contains(err.Error(), "3") || !strings.Contains(err.Error(), "2") {
			t.Errorf("message %q does not name both limits", err)
		}
		if _, err = s3.Acquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
			t.Fatalf("blocking Acquire: %v", err)
		}
		mu.Lock()
		if len(events) == 0 || events[len(events)-1].Kind != redsem.EventLimitMismatch {
			t.Errorf("observer did not see the mismatch: %v", events)
		}
		mu.Unlock()
		// SetLimit settles it for everyone, and outlives idle periods.
		if err := s3.SetLimit(ctx, 4); err != nil {
			t.Fatal(err)
		}
		var held []redsem.Lease
		for i := 0; i < 3; i++ {
			l, err := s3.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("acquire %d after SetLimit(4): %v", i, err)
			}
			held = append(held, l)
		}
		if _, err := s2.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatalf("5th holder over SetLimit 4: %v", err)
		}
		st, _ := s2.Status(ctx)
		if st.Limit != 4 || len(st.Holders) != 4 {
			t.Fatalf("status %+v", st)
		}
		for _, h := range append(held, l) {
			_ = h.Release(ctx)
		}
		if err := s2.SetLimit(ctx, 0); !errors.Is(err, redsem.ErrInvalidConfig) {
			t.Errorf("SetLimit(0): %v", err)
		}
	})
}

// Many goroutines on several clients never see more than limit holders at
// once: checked with a shared counter and by recording intervals.
func TestHammerIntervals(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 60*time.Second)
		const limit, clients, perClient, rounds = 3, 3, 4, 8
		name := redistest.Name(t)
		// from..to is the hold as fn saw it; called..returned spans the
		// whole Do call (Acquire called .. Release returned).
		type interval struct {
			from, to         time.Time
			called, returned time.Time
			slot             int
			token            int64
		}
		var mu sync.Mutex
		var ivs []interval
		var cur, peak int
		var wg sync.WaitGroup
		for c := 0; c < clients; c++ {
			s := mustNew(t, v, redistest.Client(t), name, limit, opts{})
			for g := 0; g < perClient; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < rounds; i++ {
						var iv interval
						iv.called = time.Now()
						err := redsem.Do(ctx, s, func(ctx context.Context, l redsem.Lease) error {
							iv.from, iv.slot, iv.token = time.Now(), l.Slot(), l.Token()
							mu.Lock()
							cur++
							peak = max(peak, cur)
							mu.Unlock()
							time.Sleep(time.Millisecond)
							mu.Lock()
							cur--
							mu.Unlock()
							iv.to = time.Now()
							return nil
						})
						iv.returned = time.Now()
						mu.Lock()
						ivs = append(ivs, iv)
						mu.Unlock()
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		if peak > limit {
			t.Fatalf("peak %d holders, limit %d", peak, limit)
		}
		if len(ivs) != clients*perClient*rounds {
			t.Fatalf("%d intervals, want %d", len(ivs), clients*perClient*rounds)
		}
		// Sweep: at no instant more than limit intervals overlap, and no two
		// overlapping intervals share a slot.
		type edge struct {
			at    time.Time
			delta int
		}
		var edges []edge
		tokens := map[int64]bool{}
		for _, iv := range ivs {
			edges = append(edges, edge{iv.from, 1}, edge{iv.to, -1})
			if tokens[iv.token] {
				t.Fatalf("token %d issued twice", iv.token)
			}
			tokens[iv.token] = true
			if iv.slot < 0 || iv.slot >= limit {
				t.Fatalf("slot %d out of range", iv.slot)
			}
		}
		sort.Slice(edges, func(i, j int) bool {
			if edges[i].at.Equal(edges[j].at) {
				return edges[i].delta < edges[j].delta
			}
			return edges[i].at.Before(edges[j].at)
		})
		n := 0
		for _, e := range edges {
			n += e.delta
			if n > limit {
				t.Fatalf("%d intervals overlap at %v", n, e.at)
			}
		}
		for i, a := range ivs {
			for _, b := range ivs[i+1:] {
				overlap := a.from.Before(b.to) && b.from.Before(a.to)
				if overlap && a.slot == b.slot {
					t.Fatalf("overlapping leases share slot %d", a.slot)
				}
				// A lease whose release returned before another's Acquire was
				// called was granted first, so its token is smaller.
				if a.returned.Before(b.called) && a.token >= b.token || b.returned.Before(a.called) && b.token >= a.token {
					t.Fatalf("a lease released before another was requested has the larger token")
				}
			}
		}
	})
}

// Close makes blocked Acquire calls return ErrClosed and leave nothing
// queued; leases granted before keep working.
func TestCloseUnblocksWaiters(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		s := mustNew(t, v, redistest.Client(t), name, 1, opts{})
		other := mustNew(t, v, redistest.Client(t), name, 1, opts{})
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := other.Acquire(ctx)
			errc <- err
		}()
		if v.name == "fair" { // wait until it is queued
			for {
				st, err := s.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Waiters) == 1 {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		if err := other.(interface{ Close() error }).Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, redsem.ErrClosed) {
				t.Fatalf("blocked Acquire after Close: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("blocked Acquire did not return after Close")
		}
		if _, err := other.TryAcquire(ctx); !errors.Is(err, redsem.ErrClosed) {
			t.Errorf("TryAcquire after Close: %v", err)
		}
		st, err := s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Waiters) != 0 || len(st.Holders) != 1 {
			t.Errorf("status after Close: %+v", st)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
