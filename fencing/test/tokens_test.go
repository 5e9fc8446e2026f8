package fencing_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
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

// maxExact is 2^53: tokens must stay below it to be exact in Lua's doubles.
const maxExact = int64(1) << 53

type variant struct {
	name string
	new  func(t *testing.T, c *redis.Client, name string, limit int) redsem.Semaphore
}

var variants = []variant{
	{"unfair", func(t *testing.T, c *redis.Client, name string, limit int) redsem.Semaphore {
		s, err := unfair.New(c, name, limit, unfair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
	{"fair", func(t *testing.T, c *redis.Client, name string, limit int) redsem.Semaphore {
		s, err := fair.New(c, name, limit, fair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

// use is one acquisition: its lease's slot and token, and when (one
// monotonic clock) Acquire was called, Acquire returned and Release was
// called. The grant happened in Redis somewhere in [invoked, acquired].
type use struct {
	slot     int
	token    int64
	invoked  time.Time
	acquired time.Time
	released time.Time
}

// TestTokensUnderContention: many goroutines acquire and release, and every
// token is unique, below 2^53, and greater than the token of every lease
// released before its Acquire was called; per slot, tokens increase in
// acquisition order.
func TestTokensUnderContention(t *testing.T) {
	const workers, perWorker, limit = 16, 150, 3
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 50*time.Second)
			sem := v.new(t, redistest.Client(t), redistest.Name(t), limit)
			var (
				mu   sync.Mutex
				uses []use
				wg   sync.WaitGroup
			)
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < perWorker; i++ {
						invoked := time.Now()
						l, err := sem.Acquire(ctx)
						if err != nil {
							errs <- err
							return
						}
						u := use{slot: l.Slot(), token: l.Token(), invoked: invoked, acquired: time.Now()}
						if rand.IntN(4) == 0 {
							runtime.Gosched()
						}
						u.released = time.Now()
						if err := l.Release(ctx); err != nil {
							errs <- err
							return
						}
						mu.Lock()
						uses = append(uses, u)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if len(uses) != workers*perWorker {
				t.Fatalf("%d acquisitions, want %d", len(uses), workers*perWorker)
			}
			checkTokens(t, uses, limit)
		})
	}
}

func checkTokens(t *testing.T, uses []use, limit int) {
	t.Helper()
	seen := make(map[int64]bool, len(uses))
	for _, u := range uses {
		if u.token <= 0 || u.token >= maxExact {
			t.Fatalf("token %d outside (0, 2^53)", u.token)
		}
		if seen[u.token] {
			t.Fatalf("token %d issued twice", u.token)
		}
		seen[u.token] = true
		if u.slot < 0 || u.slot >= limit {
			t.Fatalf("slot %d outside [0, %d)", u.slot, limit)
		}
	}
	// Per slot, in acquisition order: intervals do not overlap and tokens
	// strictly increase.
	bySlot := map[int][]use{}
	for _, u := range uses {
		bySlot[u.slot] = append(bySlot[u.slot], u)
	}
	for slot, us := range bySlot {
		slices.SortFunc(us, func(a, b use) int { return a.acquired.Compare(b.acquired) })
		for i := 1; i < len(us); i++ {
			if !us[i-1].released.Before(us[i].acquired) {
				t.Fatalf("slot %d held twice at once", slot)
			}
			if us[i].token <= us[i-1].token {
				t.Fatalf("slot %d: token %d acquired after token %d", slot, us[i].token, us[i-1].token)
			}
		}
	}
	// Real-time order: a lease released before another's Acquire was called
	// has a smaller token (Acquire's return is no bound: a grant made early
	// may return late). Sweep calls in order, keeping the highest token among
	// leases released before the current call.
	byAcq := slices.Clone(uses)
	slices.SortFunc(byAcq, func(a, b use) int { return a.invoked.Compare(b.invoked) })
	byRel := slices.Clone(uses)
	slices.SortFunc(byRel, func(a, b use) int { return a.released.Compare(b.released) })
	var maxBefore int64
	j, ordered := 0, 0
	for _, b := range byAcq {
		for j < len(byRel) && byRel[j].released.Before(b.invoked) {
			maxBefore = max(maxBefore, byRel[j].token)
			j++
		}
		if b.token <= maxBefore {
			t.Fatalf("token %d acquired by a call made after a lease with token %d was released", b.token, maxBefore)
		}
		ordered += j
	}
	t.Logf("%d acquisitions, %d slots, %d ordered pairs checked", len(uses), len(bySlot), ordered)
}

// acquireRelease takes a lease, releases it and returns its token.
func acquireRelease(t *testing.T, ctx context.Context, s redsem.Semaphore) int64 {
	t.Helper()
	l, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return l.Token()
}

// checkAbove fails unless token is above last and below 2^53.
func checkAbove(t *testing.T, what string, token, last int64) {
	t.Helper()
	if token <= last || token >= maxExact {
		t.Fatalf("%s: token %d, want in (%d, 2^53)", what, token, last)
	}
}

// lossTest runs the data-loss event lose between acquisitions, and while a
// lease is held, for each variant: the next token is always higher.
func lossTest(t *testing.T, lose func(t *testing.T, ctx context.Context, srv *redistest.Server, name string)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 30*time.Second)
			srv := redistest.Start(t)
			name := redistest.Name(t)
			sem := v.new(t, srv.Client(t), name, 2)
			last := acquireRelease(t, ctx, sem)
			for round := 0; round < 3; round++ {
				lose(t, ctx, srv, name)
				tok := acquireRelease(t, ctx, sem)
				checkAbove(t, "after loss between acquisitions", tok, last)
				last = tok
			}
			// A holder outlives the loss (a zombie-to-be): the next lease,
			// which may get the same slot, must still have a higher token.
			held, err := sem.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkAbove(t, "held", held.Token(), last)
			lose(t, ctx, srv, name)
			next, err := sem.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkAbove(t, "after loss with a lease held", next.Token(), held.Token())
			if err := next.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := held.Release(ctx); err != nil && !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatal(err)
			}
		})
	}
}

func TestTokensSurviveFlushAll(t *testing.T) {
	lossTest(t, func(t *testing.T, ctx context.Context, srv *redistest.Server, _ string) {
		c := srv.Client(t)
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestTokensSurviveRestart(t *testing.T) {
	lossTest(t, func(t *testing.T, _ context.Context, srv *redistest.Server, _ string) {
		srv.Restart(t) // kill -9, then a fresh server (no data) on the same port
	})
}

func TestTokensSurviveMetaDel(t *testing.T) {
	lossTest(t, func(t *testing.T, ctx context.Context, srv *redistest.Server, name string) {
		meta := core.KeysFor("redsem", name).List[core.KeyMeta]
		c := srv.Client(t)
		if n, err := c.Del(ctx, meta).Result(); err != nil || n != 1 {
			t.Fatalf("DEL %s: %d, %v", meta, n, err)
		}
	})
}

// TestCounterNotAheadOfClock checks assumption (2) of docs/fencing.md: even a
// script that grants many tokens at once (SetLimit admitting queued fair
// waiters) ends with the server clock past the last token it issued, so a
// loss of the counter right afterwards cannot make tokens go back.
func TestCounterNotAheadOfClock(t *testing.T) {
	const waiters = 200
	ctx := redistest.Ctx(t, 40*time.Second)
	c := redistest.Client(t)
	name := redistest.Name(t)
	sem, err := fair.New(c, name, 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	first, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leases := make(chan redsem.Lease, waiters)
	errs := make(chan error, waiters)
	for i := 0; i < waiters; i++ {
		go func() {
			l, err := sem.Acquire(ctx)
			if err != nil {
				errs <- err
				return
			}
			leases <- l
		}()
	}
	waitFor(t, 30*time.Second, func() bool {
		st, err := sem.Status(ctx)
		return err == nil && len(st.Waiters) == waiters
	})
	// SetLimit's script (what Semaphore.SetLimit runs) and TIME back to
	// back in one pipeline: TIME runs right after the script ends.
	keys := core.KeysFor("redsem", name)
	var reply *redis.Cmd
	var now *redis.TimeCmd
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		reply = core.Script(lua.SetLimit).Eval(ctx, p, keys.List, keys.Chan, "PUBLISH", waiters+1, "call-1")
		now = p.Time(ctx)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	v, err := reply.Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 1+4*waiters {
		t.Fatalf("SetLimit granted %d, want %d", (len(v)-1)/4, waiters)
	}
	lo, hi := int64(math.MaxInt64), int64(0)
	for i := 2; i < len(v); i += 4 { // {now, (id, token, deadline, slots) x grants}
		tok, _ := v[i].(int64)
		lo, hi = min(lo, tok), max(hi, tok)
	}
	clock := now.Val().UnixMicro()
	t.Logf("%d tokens in one script: %d..%d; server clock after it: %d (%d µs past the last token)",
		waiters, lo, hi, clock, clock-hi)
	if hi-lo != waiters-1 || lo <= first.Token() {
		t.Fatalf("tokens %d..%d after %d: not consecutive", lo, hi, first.Token())
	}
	if clock <= hi {
		t.Fatalf("counter %d ahead of the server clock %d after the script", hi, clock)
	}
	for i := 0; i < waiters; i++ {
		select {
		case l := <-leases:
			_ = l.Release(ctx)
		case err := <-errs:
			t.Fatal(err)
		}
	}
	_ = first.Release(ctx)
}
