package unfair_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/unfair"
)

// acquireCalls counts a client's acquire.lua calls.
type acquireCalls struct {
	match redistest.Match
	n     atomic.Int64
}

func countAcquires(c *redis.Client) *acquireCalls {
	h := &acquireCalls{match: redistest.MatchScript(lua.Acquire.Hash(), lua.Acquire.Function())}
	c.AddHook(h)
	return h
}

func (h *acquireCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *acquireCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *acquireCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Many callers of one process waiting for few slots: each freed slot costs
// about one attempt. A caller that arrives while an older caller of the
// process sleeps until a notice for as many slots waits behind it instead
// of trying for the same slot (before: a refused attempt, a second one
// once subscribed, and the woken ones that a caller arriving meanwhile
// had beaten: 3.4 attempts per hold in redsem bench). No fallback poll
// helps: FallbackInterval is longer than the test.
func TestWaitersBehindCostOneAttemptPerHold(t *testing.T) {
	const (
		limit   = 2
		callers = 16
		rounds  = 10
	)
	ctx := redistest.Ctx(t, 60*time.Second)
	c := redistest.Client(t)
	calls := countAcquires(c)
	s, err := unfair.New(c, redistest.Name(t), limit, unfair.Options{FallbackInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var held, most atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := s.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				n := held.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				held.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most.Load() > limit {
		t.Fatalf("%d held at once, limit %d", most.Load(), limit)
	}
	holds := int64(callers * rounds)
	n := calls.n.Load()
	t.Logf("%d holds, %d acquire calls: %.2f per hold", holds, n, float64(n)/float64(holds))
	if n > holds*3/2 {
		t.Fatalf("%d acquire calls for %d holds (%.2f per hold), want at most 1.5 per hold", n, holds, float64(n)/float64(holds))
	}
}

// A caller waiting behind an older one is served by the next freed slot
// even when the older one gave up first (its context ended while asleep,
// or after a notice woke it): the notice, or the wake-up it did not use,
// goes to the next waiter, not to the fallback poll (a minute here).
func TestWaiterBehindOneThatGaveUp(t *testing.T) {
	for _, woken := range []bool{false, true} {
		name := "asleep"
		if woken {
			name = "woken"
		}
		t.Run(name, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			c := redistest.Client(t)
			calls := countAcquires(c)
			s, err := unfair.New(c, redistest.Name(t), 1, unfair.Options{FallbackInterval: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			h, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			firstCtx, giveUp := context.WithCancel(ctx)
			first := make(chan error, 1)
			go func() {
				l, err := s.Acquire(firstCtx)
				if err == nil {
					_ = l.Release(ctx)
				}
				first <- err
			}()
			// Its try, and its try once subscribed: refused, it sleeps.
			redistest.WaitFor(t, 10*time.Second, "the first caller's two attempts", func() (bool, error) { return calls.n.Load() == 3, nil })
			time.Sleep(50 * time.Millisecond)
			second := make(chan result, 1)
			go func() {
				l, err := s.Acquire(ctx)
				second <- result{l, err}
			}()
			time.Sleep(50 * time.Millisecond)
			if n := calls.n.Load(); n != 3 {
				t.Fatalf("%d acquire calls: the second caller tried (want it to wait behind the first without trying)", n)
			}
			if woken {
				// Free the slot and cancel the first caller at once: the
				// notice may reach it before or after it gave up.
				if err := h.Release(ctx); err != nil {
					t.Fatal(err)
				}
				giveUp()
			} else {
				giveUp()
				if err := <-first; !errors.Is(err, context.Canceled) {
					t.Fatalf("first caller: %v, want context.Canceled", err)
				}
				if err := h.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			released := time.Now()
			select {
			case r := <-second:
				if r.err != nil {
					t.Fatalf("second caller: %v", r.err)
				}
				t.Logf("second caller granted %v after the release", time.Since(released))
				_ = r.l.Release(ctx)
			case <-time.After(20 * time.Second):
				t.Fatal("the second caller still waits 20 s after the slot was freed: left to the fallback poll")
			}
			if woken {
				if err := <-first; err != nil && !errors.Is(err, context.Canceled) {
					t.Fatalf("first caller: %v", err)
				}
			}
		})
	}
}

// crashedHolders takes n single slots of name (limit) for holders that
// never come back: leases of ttl that nobody renews or releases (their
// process crashed), as acquire.lua grants them.
func crashedHolders(t *testing.T, ctx context.Context, name string, limit, n int, ttl time.Duration) {
	t.Helper()
	k := core.KeysFor(core.DefaultPrefix, name)
	for i := range n {
		v, err := core.Script(lua.Acquire).Run(ctx, redistest.Client(t), k.List, k.Chan, "PUBLISH", limit,
			fmt.Sprintf("crashed-%d", i), 1, ttl.Milliseconds(), "try", "-", 1000, "test", 0).Slice()
		if err != nil || len(v) == 0 || v[0] != int64(1) {
			t.Fatalf("crashed holder %d: %v %v", i, v, err)
		}
	}
}

// Callers waiting behind others are served when holders that crashed
// expire (no release, no notice: the earliest holder deadline the older
// waiter was told bounds their sleep too), and get ErrWeight as soon as
// the older one does when SetLimit lowers the limit below their weight
// (the older one leaves ungranted: those behind it try). Before: they
// waited for the fallback poll (a minute here) while slots were free.
func TestWaitersBehindNotLeftToThePoll(t *testing.T) {
	t.Run("crashed holders", func(t *testing.T) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		c := redistest.Client(t)
		calls := countAcquires(c)
		s, err := unfair.New(c, name, 2, unfair.Options{FallbackInterval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		crashedHolders(t, ctx, name, 2, 2, 1500*time.Millisecond)
		expiry := time.Now().Add(1500 * time.Millisecond)
		first := make(chan result, 1)
		go func() { l, err := s.Acquire(ctx); first <- result{l, err} }()
		redistest.WaitFor(t, 10*time.Second, "the first caller's two attempts", func() (bool, error) { return calls.n.Load() == 2, nil })
		time.Sleep(50 * time.Millisecond)
		second := make(chan result, 1)
		go func() { l, err := s.Acquire(ctx); second <- result{l, err} }()
		time.Sleep(50 * time.Millisecond)
		if n := calls.n.Load(); n != 2 {
			t.Fatalf("%d acquire calls: the second caller tried (want it behind the first)", n)
		}
		for i, ch := range []chan result{first, second} {
			select {
			case r := <-ch:
				if r.err != nil {
					t.Fatalf("caller %d: %v", i+1, r.err)
				}
				t.Logf("caller %d granted %v after the crashed holders' deadline", i+1, time.Since(expiry))
				defer r.l.Release(ctx)
			case <-time.After(20 * time.Second):
				t.Fatalf("caller %d still waits %v after the crashed holders' deadline: left to the fallback poll", i+1, time.Since(expiry))
			}
		}
	})
	t.Run("ErrWeight", func(t *testing.T) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		c := redistest.Client(t)
		calls := countAcquires(c)
		s, err := unfair.New(c, name, 4, unfair.Options{FallbackInterval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		crashedHolders(t, ctx, name, 4, 4, 2*time.Second)
		errs := make(chan error, 2)
		go func() { _, err := s.AcquireN(ctx, 3); errs <- err }()
		redistest.WaitFor(t, 10*time.Second, "the first caller's two attempts", func() (bool, error) { return calls.n.Load() == 2, nil })
		time.Sleep(50 * time.Millisecond)
		go func() { _, err := s.AcquireN(ctx, 3); errs <- err }()
		time.Sleep(50 * time.Millisecond)
		if n := calls.n.Load(); n != 2 {
			t.Fatalf("%d acquire calls: the second caller tried (want it behind the first)", n)
		}
		o, err := unfair.New(redistest.Client(t), name, 4, unfair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close() })
		if err := o.SetLimit(ctx, 2); err != nil {
			t.Fatal(err)
		}
		lowered := time.Now()
		for i := range 2 {
			select {
			case err := <-errs:
				if !errors.Is(err, redsem.ErrWeight) {
					t.Fatalf("caller %d: %v, want ErrWeight", i+1, err)
				}
				t.Logf("a caller got ErrWeight %v after SetLimit", time.Since(lowered))
			case <-time.After(20 * time.Second):
				t.Fatalf("a caller still waits %v after SetLimit(2) made its weight too large: left to the fallback poll", time.Since(lowered))
			}
		}
	})
}
