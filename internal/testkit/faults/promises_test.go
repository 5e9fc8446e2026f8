package faults_test

// Tests of promises that docs/promises.md listed as gaps and that need a
// proxy or a paused redis-server; they go through fair.New, unfair.New,
// NewFamily and their methods (not the engine). The others are in the
// root package's promises_test.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// watchdogRenewals selects the calls of renewmany.lua: the watchdog renews
// a process's leases of a semaphore that are due together, in one call.
var watchdogRenewals = redistest.MatchScript(lua.RenewMany.Hash(), lua.RenewMany.Function())

// scriptCalls is a go-redis hook that records when each call of one script
// started and how it ended.
type scriptCalls struct {
	match redistest.Match
	mu    sync.Mutex
	start []time.Time
	errs  []error
}

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.match(cmd) {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		i := len(h.start)
		h.start = append(h.start, time.Now())
		h.errs = append(h.errs, nil)
		h.mu.Unlock()
		err := next(ctx, cmd)
		h.mu.Lock()
		h.errs[i] = err
		h.mu.Unlock()
		return err
	}
}
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// since returns the start times of the calls that started at or after t.
func (h *scriptCalls) since(t time.Time) []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Time
	for _, s := range h.start {
		if !s.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// A renewal that Redis does not answer is retried every
// min(LeaseTTL/10, 1 s) until the deadline, so a lease outlives an outage
// shorter than what it has left (operations.md §3). The holder's client
// goes through a proxy that black-holes everything for 4 s, starting just
// after a renewal, with LeaseTTL 6 s (renewed every 2 s, retried every
// 600 ms). The client's ReadTimeout (200 ms, no go-redis retries)
// ends each attempt that gets no answer; without one, an attempt would
// wait until the deadline. Asserted: during the outage the watchdog tries
// again and again (the renewal that falls due, then retries, each at least
// LeaseTTL/10 after the one before); once the proxy heals, a retry renews
// the lease before its deadline: Done stays open, Err nil, the deadline
// moves on, and no other client gets the slot.
func TestPromiseRenewalRetriedThroughOutage(t *testing.T) {
	const (
		ttl         = 3 * time.Second
		retry       = ttl / 10 // min(LeaseTTL/10, 1 s)
		readTimeout = 100 * time.Millisecond
		outage      = 2200 * time.Millisecond
	)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			p := redistest.StartProxy(t, redistest.Shared(t).Addr)
			renews := &scriptCalls{match: watchdogRenewals}
			c := redis.NewClient(&redis.Options{Addr: p.Addr, DialTimeout: time.Second,
				ReadTimeout: readTimeout, WriteTimeout: readTimeout, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(renews)
			s := v.new(t, c, name, 1, opts{LeaseTTL: ttl})
			other := v.new(t, redistest.Client(t), name, 1, opts{LeaseTTL: ttl})

			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Start the outage just after a renewal: the deadline has a
			// whole LeaseTTL to go, the next renewal is due in LeaseTTL/3.
			d := l.Deadline()
			waitFor(ctx, t, "the first renewal", func() bool { return l.Deadline().After(d) })
			before := l.Deadline()
			p.SetBlackhole(true)
			cut := time.Now()
			waitFor(ctx, t, "the outage to last its time", func() bool {
				select {
				case <-l.Done():
					t.Fatalf("lease lost %v into the outage (deadline %v after the cut): %v", time.Since(cut), before.Sub(cut), l.Err())
				default:
				}
				return time.Since(cut) >= outage
			})
			during := renews.since(cut)
			p.SetBlackhole(false)
			healed := time.Now()
			waitFor(ctx, t, "a renewal after the heal, or the loss", func() bool {
				select {
				case <-l.Done():
					return true
				default:
				}
				return l.Deadline().After(before)
			})
			renewed := time.Now()
			t.Logf("outage %v from %v before the deadline; %d renewal attempts in it, at %v after the cut; renewed %v after the heal, %v before the old deadline",
				outage, before.Sub(cut).Round(time.Millisecond), len(during), offsets(during, cut), renewed.Sub(healed).Round(time.Millisecond),
				before.Sub(renewed).Round(time.Millisecond))
			if err := l.Err(); err != nil {
				t.Fatalf("lease after an outage of %v with %v left: %v", outage, before.Sub(cut), err)
			}
			select {
			case <-l.Done():
				t.Fatal("lease done after the outage")
			default:
			}
			if !l.Deadline().After(before) || !renewed.Before(before) {
				t.Errorf("deadline %v (before the outage %v), renewed at %v: want a renewal before the old deadline", l.Deadline(), before, renewed)
			}
			if len(during) < 3 {
				t.Errorf("%d renewal attempts during an outage of %v, want the due one and retries every %v (at least 3)", len(during), outage, retry)
			}
			for i := 1; i < len(during); i++ {
				if gap := during[i].Sub(during[i-1]); gap < retry {
					t.Errorf("renewal attempts %d and %d %v apart, want at least min(LeaseTTL/10, 1 s) = %v", i-1, i, gap, retry)
				}
			}
			if _, err := other.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Errorf("another client after the outage: %v, want ErrNoSlot", err)
			}
			expectHolders(t, ctx, other, l.ID())
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// offsets returns each time's distance from t, rounded to milliseconds.
func offsets(ts []time.Time, t time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, x := range ts {
		out[i] = x.Sub(t).Round(time.Millisecond)
	}
	return out
}

// waitFor polls cond every 5 ms until it returns true, or fails the test
// when ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// ---- every call bounded by its context ----

// promiseCalls are the calls of the promise "every call returns when its
// context ends" that TestCallsReturnWhenContextEnds does not make, on
// fair.Semaphore, unfair.Semaphore and their families: Resume of a lease
// another semaphore value granted, and of one this semaphore holds.
var promiseCalls = []string{"SetRate", "TryAcquireN", "Family.SetTotal", "Family.Status", "Family.Status/no total", "Resume", "Resume/own"}

// promiseRig is one failure mode's Redis with, for each variant, a
// semaphore, another value of it, and two families (with and without a
// total).
type promiseRig struct {
	f         fault
	c         *redis.Client
	brk, heal func()
	sems      []closer // one per variant, in the order of variants
	others    []closer // another value of the same semaphore
	fams      []family // with a total
	plain     []family // without
	members   []redsem.Semaphore
	names     []string
}

func newPromiseRig(t *testing.T, f fault) *promiseRig {
	t.Helper()
	r := &promiseRig{f: f}
	r.c, r.brk, r.heal = f.start(t)
	for _, v := range variants {
		name := redistest.Name(t) + "-" + v.name
		r.names = append(r.names, name)
		r.sems = append(r.sems, v.new(t, r.c, name, 8, opts{}))
		r.others = append(r.others, v.new(t, r.c, name, 8, opts{}))
		for _, total := range []int{8, 0} {
			fam := v.newTotalFamily(t, r.c, fmt.Sprintf("%s-total%d", name, total), 4, total, opts{})
			m, err := fam.get("k")
			if err != nil {
				t.Fatal(err)
			}
			r.members = append(r.members, m)
			if total > 0 {
				r.fams = append(r.fams, fam)
			} else {
				r.plain = append(r.plain, fam)
			}
		}
	}
	return r
}

// round makes every call of both variants once, all at once, with Redis
// broken, then heals Redis and releases what it took. It returns the
// calls' results and the semaphores' entries left in Redis afterwards.
func (r *promiseRig) round(t *testing.T) ([]callResult, []core.Raw) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// While Redis works: a lease of each semaphore value (its own and
	// another's, to resume); every call's script loaded, each family's
	// shard record and total in place.
	own := make([]redsem.Lease, len(r.sems))
	elsewhere := make([]redsem.Lease, len(r.sems))
	for i := range r.sems {
		var err error
		if own[i], err = r.sems[i].TryAcquire(ctx); err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
		if elsewhere[i], err = r.others[i].TryAcquire(ctx); err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
		if err := r.sems[i].SetRate(ctx, redsem.Rate{}); err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
		if err := r.fams[i].SetTotal(ctx, 8); err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
		for _, f := range []family{r.fams[i], r.plain[i]} {
			if _, err := f.Status(ctx); err != nil {
				t.Fatalf("%s: setup: %v", r.f.name, err)
			}
		}
	}
	for _, m := range r.members {
		l, err := m.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%s: setup: %v", r.f.name, err)
		}
	}
	r.brk()
	var res []callResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range r.sems {
		for _, call := range promiseCalls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(context.Background(), boundCtx)
				defer cancel()
				start := time.Now()
				woke := make(chan time.Duration, 1)
				go func() {
					<-cctx.Done()
					woke <- time.Since(start)
				}()
				var l redsem.Lease
				var err error
				switch call {
				case "SetRate":
					err = r.sems[i].SetRate(cctx, redsem.Rate{})
				case "TryAcquireN":
					l, err = r.sems[i].TryAcquireN(cctx, 2)
				case "Family.SetTotal":
					err = r.fams[i].SetTotal(cctx, 8)
				case "Family.Status":
					_, err = r.fams[i].Status(cctx)
				case "Family.Status/no total":
					_, err = r.plain[i].Status(cctx)
				case "Resume":
					l, err = r.sems[i].Resume(cctx, elsewhere[i].ID())
				case "Resume/own":
					l, err = r.sems[i].Resume(cctx, own[i].ID())
				}
				took := time.Since(start)
				cancel()
				mu.Lock()
				res = append(res, callResult{variants[i].name, call, took, <-woke, err})
				mu.Unlock()
				if l != nil && call != "Resume/own" {
					_ = l.Release(context.Background())
				}
			}()
		}
	}
	wg.Wait()
	r.heal()
	raws := make([]core.Raw, len(r.sems))
	for i := range r.sems {
		for _, l := range []redsem.Lease{own[i], elsewhere[i]} {
			_ = l.Release(ctx) // may find it gone (a restart)
		}
		for _, s := range []redsem.Semaphore{r.sems[i], r.others[i]} {
			core.EngineOf(s).WaitBackground()
		}
		raw, err := core.Inspect(ctx, r.c, core.EngineOf(r.sems[i]).Keys())
		if err != nil {
			t.Fatalf("%s: inspect: %v", r.f.name, err)
		}
		raws[i] = raw
	}
	sort.Slice(res, func(a, b int) bool {
		return res[a].variant+res[a].call < res[b].variant+res[b].call
	})
	return res, raws
}

// SetRate, TryAcquireN, a family's SetTotal and Status (with a total and
// without one), and Resume (of a lease granted by another semaphore value,
// and of one this value holds) return within boundSlack of their 300 ms
// context's end, with the context's error (or, Redis refusing, at once
// with a connection error), whether Redis refuses connections,
// black-holes them, is paused (SIGSTOP) or answers a second late; the
// clients have go-redis's default options. Once Redis works again, the
// semaphores hold no entry but what the test released.
func TestPromiseMoreCallsReturnWhenContextEnds(t *testing.T) {
	for _, f := range faultModes {
		t.Run(f.name, func(t *testing.T) {
			r := newPromiseRig(t, f)
			res, raws := r.round(t)
			for _, x := range res {
				checkBound(t, f, x)
				t.Logf("%-7s %-22s %7v  %v", x.variant, x.call, x.took.Round(time.Millisecond), x.err)
			}
			for i, raw := range raws {
				if raw.Live() {
					t.Errorf("%s/%s: entries left behind: %+v", f.name, variants[i].name, raw)
				}
			}
		})
	}
}

// ---- a slow or paused Redis is a timeout ----

// An Acquire or TryAcquire whose context ends while Redis is paused
// (SIGSTOP), answers a second late or black-holes the connection gets an
// error matching context.DeadlineExceeded and not ErrUnavailable (Redis
// may have run the request), and the Observer reports
// EventAcquireTimedOut, not EventUnavailable.
func TestPromiseSlowRedisIsATimeout(t *testing.T) {
	for _, f := range faultModes {
		if f.refuses {
			continue // unreachable: ErrUnavailable is right there
		}
		t.Run(f.name, func(t *testing.T) {
			c, brk, heal := f.start(t)
			for _, v := range variants {
				var mu sync.Mutex
				var kinds []redsem.EventKind
				obs := func(ev redsem.Event) {
					mu.Lock()
					kinds = append(kinds, ev.Kind)
					mu.Unlock()
				}
				s := v.new(t, c, redistest.Name(t)+"-"+v.name, 2, opts{Observer: obs})
				ctx := redistest.Ctx(t, 30*time.Second)
				// While Redis works: connections open, scripts loaded.
				for range 2 {
					l, err := s.TryAcquire(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				mu.Lock()
				kinds = nil
				mu.Unlock()
				brk()
				for _, call := range []string{"Acquire", "TryAcquire"} {
					cctx, cancel := context.WithTimeout(ctx, boundCtx)
					var l redsem.Lease
					var err error
					if call == "Acquire" {
						l, err = s.Acquire(cctx)
					} else {
						l, err = s.TryAcquire(cctx)
					}
					cancel()
					if l != nil {
						t.Errorf("%s/%s with Redis %s: granted", v.name, call, f.name)
					}
					if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redsem.ErrUnavailable) {
						t.Errorf("%s/%s with Redis %s: %v; want a timeout (context.DeadlineExceeded), not ErrUnavailable", v.name, call, f.name, err)
					}
					t.Logf("%s/%s: %v", v.name, call, err)
				}
				heal()
				core.EngineOf(s).WaitBackground()
				mu.Lock()
				got := slices.Clone(kinds)
				mu.Unlock()
				want := []redsem.EventKind{redsem.EventAcquireTimedOut, redsem.EventAcquireTimedOut}
				if !slices.Equal(got, want) {
					t.Errorf("%s: events %v, want %v", v.name, got, want)
				}
			}
		})
	}
}

// ---- the rate counts no re-sent request ----

// newRatedSem builds variant v's semaphore with a rate.
func (v variant) newRatedSem(t testing.TB, c redis.UniversalClient, name string, limit int, rate redsem.Rate) closer {
	t.Helper()
	var s closer
	var err error
	if v.fair {
		s, err = fair.New(c, name, limit, fair.Options{Rate: rate, LeaseTTL: 10 * time.Second})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{Rate: rate, LeaseTTL: 10 * time.Second})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A TryAcquire whose reply is lost after Redis ran it, and which go-redis
// sends again, counts once in the rate's window: with limit 2 and
// Rate{1, 10s}, the client gets one lease, Status shows one holder and one
// slot granted in the window, and a second client's TryAcquire is refused
// by the rate (a slot is free) rather than granted.
func TestPromiseRateCountsNoResentRequest(t *testing.T) {
	rate := redsem.Rate{Limit: 1, Per: 10 * time.Second}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			srv := redistest.Shared(t)
			p := redistest.StartProxy(t, srv.Addr)
			opt := srv.Options()
			opt.Addr = p.Addr
			opt.MaxRetries = 1
			opt.MinRetryBackoff, opt.MaxRetryBackoff = 50*time.Millisecond, 50*time.Millisecond
			ca := redis.NewClient(opt)
			t.Cleanup(func() { _ = ca.Close() })
			name := redistest.Name(t)
			a := v.newRatedSem(t, ca, name, 2, rate)
			b := v.newRatedSem(t, redistest.Client(t), name, 2, rate)
			// A's connection open and the library loaded (Status counts
			// nothing in the window), so that the reply lost is the
			// acquire's.
			if _, err := a.Status(ctx); err != nil {
				t.Fatal(err)
			}
			mk := marker(t, a, lua.Acquire)
			if core.EngineOf(a).ScriptMode() != "fcall" {
				mk = []byte("-- acquire.lua:") // the first acquire sends the script whole (EVAL)
			}
			p.DropMatching(mk, 1)
			p.Watch(mk)
			l, err := a.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire whose first reply was lost: %v", err)
			}
			if dropped, _ := p.Faults(); dropped != 1 || p.Watched() != 2 {
				t.Fatalf("%d replies lost, %d acquire requests sent; want the first one's lost and one re-sent", dropped, p.Watched())
			}
			t.Logf("scripts run as %s; the acquire's reply lost once, the request sent twice", core.EngineOf(a).ScriptMode())
			st, err := b.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 1 || st.Holders[0].ID != l.ID() || st.RateGranted != 1 {
				t.Errorf("status after the re-sent TryAcquire: %d holders, %d granted in the window; want 1 and 1 (%+v)", len(st.Holders), st.RateGranted, st)
			}
			bl, err := b.TryAcquire(ctx)
			if !errors.Is(err, redsem.ErrRateLimited) {
				if bl != nil {
					_ = bl.Release(ctx)
				}
				t.Errorf("another client's TryAcquire with a slot free and one grant in the window: (%v, %v), want ErrRateLimited", bl, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
