package redsem_test

// Tests of promises that docs/promises.md listed as gaps: each goes through
// the entry point the user calls (redsem.Do, a Lease, fair.New and
// unfair.New and their methods, NewFamily, Resume), on a real redis-server.
// The ones that need a proxy or a paused server are in
// internal/testkit/faults/promises_test.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// popts are the options the promise tests set; both variants take them.
type popts struct {
	LeaseTTL, MaxHold time.Duration
	Owner             string
	Observer          redsem.Observer
	Logger            *slog.Logger
}

// newP builds variant v's semaphore with o; the caller closes it (or not).
func newP(v variant, c redis.UniversalClient, name string, limit int, o popts) (redsem.Semaphore, error) {
	if v.name == "fair" {
		s, err := fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, MaxHold: o.MaxHold, Owner: o.Owner,
			Observer: o.Observer, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, MaxHold: o.MaxHold, Owner: o.Owner,
		Observer: o.Observer, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// mustP is newP, closed when the test ends.
func mustP(t *testing.T, v variant, c redis.UniversalClient, name string, limit int, o popts) redsem.Semaphore {
	t.Helper()
	s, err := newP(v, c, name, limit, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// pFamily is a family of either variant, seen through what both offer.
type pFamily struct {
	get      func(key string) (redsem.Semaphore, error)
	setTotal func(ctx context.Context, total int) error
	status   func(ctx context.Context) (redsem.FamilyStatus, error)
	close    func() error
}

// newPFamily builds variant v's family with the FamilyOptions fields given.
func newPFamily(v variant, c redis.UniversalClient, name string, limit int, idleAfter time.Duration, shards, total int) (*pFamily, error) {
	if v.name == "fair" {
		f, err := fair.NewFamily(c, name, limit, fair.FamilyOptions{IdleAfter: idleAfter, Shards: shards, Total: total})
		if err != nil {
			return nil, err
		}
		return &pFamily{
			get: func(key string) (redsem.Semaphore, error) {
				s, err := f.Get(key)
				if err != nil {
					return nil, err
				}
				return s, nil
			},
			setTotal: f.SetTotal, status: f.Status, close: f.Close,
		}, nil
	}
	f, err := unfair.NewFamily(c, name, limit, unfair.FamilyOptions{IdleAfter: idleAfter, Shards: shards, Total: total})
	if err != nil {
		return nil, err
	}
	return &pFamily{
		get: func(key string) (redsem.Semaphore, error) {
			s, err := f.Get(key)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		setTotal: f.SetTotal, status: f.Status, close: f.Close,
	}, nil
}

// mustPFamily is newPFamily, closed when the test ends.
func mustPFamily(t *testing.T, v variant, c redis.UniversalClient, name string, limit, total int) *pFamily {
	t.Helper()
	f, err := newPFamily(v, c, name, limit, 0, 0, total)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.close() })
	return f
}

// member returns f's member of key.
func (f *pFamily) member(t *testing.T, key string) redsem.Semaphore {
	t.Helper()
	s, err := f.get(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holdersOf returns the ids of s's live holders, sorted.
func holdersOf(ctx context.Context, t *testing.T, s redsem.Semaphore) []string {
	t.Helper()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, h := range st.Holders {
		ids = append(ids, h.ID)
	}
	slices.Sort(ids)
	return ids
}

// forceReleaseAny removes id (a lease or a fair waiter) from semaphore
// name behind its holder's back, as "redsem release NAME ID" does, and
// returns the kind of release (core.ReleasedLease, core.ReleasedWaiter).
func forceReleaseAny(ctx context.Context, t *testing.T, c redis.UniversalClient, name, id string) int {
	t.Helper()
	e, err := core.New(core.Config{Client: c, Name: name, Limit: 1, Prefix: core.DefaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	kind, _, err := e.ForceRelease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return kind
}

// ---- Do ----

// Do returns fn's error joined with the error of the Release that follows
// it when that Release fails otherwise than with ErrLeaseLost: here Redis
// is killed while fn runs, so the release finds nothing listening (an
// error matching ErrUnavailable), long before the lease's deadline.
func TestPromiseDoJoinsReleaseError(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		srv := redistest.Start(t)
		s := mustNew(t, v, srv.Client(t), redistest.Name(t), 1, opts{LeaseTTL: 20 * time.Second})
		fnErr := errors.New("fn's own failure")
		var lease redsem.Lease
		err := redsem.Do(ctx, s, func(_ context.Context, l redsem.Lease) error {
			lease = l
			srv.Kill(t) // nothing listens any more: the release is refused
			return fnErr
		})
		if lease == nil {
			t.Fatalf("fn did not run: %v", err)
		}
		if !errors.Is(err, fnErr) {
			t.Errorf("Do: %v, want fn's error in it", err)
		}
		if !errors.Is(err, redsem.ErrUnavailable) {
			t.Errorf("Do: %v, want the failed Release's error (matching ErrUnavailable) joined to fn's", err)
		}
		if errors.Is(err, redsem.ErrLeaseLost) || lease.Err() != nil {
			t.Errorf("Do: %v, lease Err %v: the release failed well before the deadline, nothing was lost", err, lease.Err())
		}
		if !strings.Contains(err.Error(), fnErr.Error()) || strings.TrimSpace(err.Error()) == fnErr.Error() {
			t.Errorf("Do: %q, want fn's error and the release's, both said", err)
		}
		t.Logf("Do: %v", err)
	})
}

// Do returns Acquire's error when no slot is granted, and fn never runs:
// a context that ends while another client holds the slot (nothing is left
// queued), a client built with another limit (ErrLimitMismatch), and a
// closed semaphore (ErrClosed).
func TestPromiseDoReturnsAcquireError(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		holder := mustNew(t, v, redistest.Client(t), name, 1, opts{})
		l, err := holder.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(ctx) }()
		ran := 0
		fn := func(context.Context, redsem.Lease) error { ran++; return nil }

		s := mustNew(t, v, redistest.Client(t), name, 1, opts{})
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = redsem.Do(dctx, s, fn)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || ran != 0 {
			t.Errorf("Do with every slot held until its deadline: %v, fn ran %d times; want context.DeadlineExceeded and fn not run", err, ran)
		}
		assertNotQueued(ctx, t, holder)

		m := mustNew(t, v, redistest.Client(t), name, 2, opts{})
		err = redsem.Do(ctx, m, fn)
		if !errors.Is(err, redsem.ErrLimitMismatch) || ran != 0 {
			t.Errorf("Do on a client built with another limit: %v, fn ran %d times; want ErrLimitMismatch and fn not run", err, ran)
		}
		var lm *redsem.LimitMismatchError
		if !errors.As(err, &lm) || lm.Client != 2 || lm.Established != 1 {
			t.Errorf("Do's mismatch error %v, want a *LimitMismatchError naming 2 and 1", err)
		}

		closed := mustNew(t, v, redistest.Client(t), name, 1, opts{})
		_ = closed.Close()
		if err := redsem.Do(ctx, closed, fn); !errors.Is(err, redsem.ErrClosed) || ran != 0 {
			t.Errorf("Do on a closed semaphore: %v, fn ran %d times; want ErrClosed and fn not run", err, ran)
		}
		if got := holdersOf(ctx, t, holder); !slices.Equal(got, []string{l.ID()}) {
			t.Errorf("holders %v after the failed Do calls, want only %s", got, l.ID())
		}
	})
}

// ---- Semaphore: options ----

// An Owner of more than 256 bytes, or one with a newline, is refused by New
// with a *ConfigError naming Options.Owner; 256 bytes are taken.
func TestPromiseOwnerValidated(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does no I/O
	defer c.Close()
	forEach(t, func(t *testing.T, v variant) {
		for desc, owner := range map[string]string{
			"257 bytes":      strings.Repeat("o", 257),
			"a newline":      "front\nworker",
			"a final \\n":    "front\n",
			"257 bytes utf8": strings.Repeat("é", 128) + "x", // 2*128+1 bytes
		} {
			s, err := newP(v, c, "n", 1, popts{Owner: owner})
			var ce *redsem.ConfigError
			if s != nil || !errors.As(err, &ce) || !errors.Is(err, redsem.ErrInvalidConfig) || ce.Field != "Options.Owner" {
				t.Errorf("Owner with %s: got (%v, %v), want a *ConfigError for Options.Owner", desc, s, err)
			}
		}
		s, err := newP(v, c, "n", 1, popts{Owner: strings.Repeat("o", 256)})
		if err != nil {
			t.Errorf("Owner of 256 bytes: %v, want it taken", err)
		} else {
			_ = s.Close()
		}
	})
}

// Rate.String formats a rate the way ParseRate reads it, and the zero Rate
// as "none".
func TestPromiseRateString(t *testing.T) {
	if got := (redsem.Rate{}).String(); got != "none" {
		t.Errorf("zero Rate prints %q, want \"none\"", got)
	}
	if got := (redsem.Rate{Limit: 60, Per: time.Minute}).String(); got != "60/1m" {
		t.Errorf("60 a minute prints %q, want \"60/1m\" (the doc's example)", got)
	}
	for _, r := range []redsem.Rate{
		{},
		{Limit: 60, Per: time.Minute},
		{Limit: 100, Per: time.Second},
		{Limit: 5, Per: 250 * time.Millisecond},
		{Limit: 1, Per: 1500 * time.Millisecond},
		{Limit: 1000, Per: time.Hour},
		{Limit: 1 << 20, Per: 366 * 24 * time.Hour},
		{Limit: 3, Per: 1234567 * time.Microsecond},
		{Limit: 7, Per: time.Nanosecond},
		{Limit: 5, Per: -time.Second}, // ParseRate checks no bounds
		{Limit: 0, Per: time.Second},
		{Limit: 5},
	} {
		s := r.String()
		back, err := redsem.ParseRate(s)
		if err != nil || back != r {
			t.Errorf("ParseRate(%+v.String() = %q) = %+v, %v; want the rate back", r, s, back, err)
		}
	}
}

// EventKind.String is each kind's name in snake_case.
func TestPromiseEventKindString(t *testing.T) {
	want := map[redsem.EventKind]string{
		redsem.EventAcquired:        "acquired",
		redsem.EventReleased:        "released",
		redsem.EventLeaseLost:       "lease_lost",
		redsem.EventWaiterEvicted:   "waiter_evicted",
		redsem.EventAcquireTimedOut: "acquire_timed_out",
		redsem.EventLimitMismatch:   "limit_mismatch",
		redsem.EventEvictionPolicy:  "eviction_policy",
		redsem.EventAcquireFailed:   "acquire_failed",
		redsem.EventUnavailable:     "unavailable",
		redsem.EventResumed:         "resumed",
	}
	for k, name := range want {
		if got := k.String(); got != name {
			t.Errorf("EventKind %d String() = %q, want %q", int(k), got, name)
		}
	}
	// Every kind that has a name is one of the above (a kind added later
	// must be added here, with its snake_case name).
	for k := redsem.EventKind(0); k < 64; k++ {
		if _, ok := want[k]; !ok && k.String() != "unknown" {
			t.Errorf("EventKind %d String() = %q: a kind this test does not know", int(k), k.String())
		}
	}
}

// ---- Semaphore: the client hook ----

// hookLog is a go-redis hook that records what passes through it.
type hookLog struct {
	mu    sync.Mutex
	cmds  []redis.Cmder // every command, in the order it entered
	args  []string      // its arguments as it entered
	pipes [][]redis.Cmder
	conns []net.Conn // what each dial returned
	dials []string   // network and address of each dial
}

func (h *hookLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		h.mu.Lock()
		h.dials = append(h.dials, network+" "+addr)
		h.conns = append(h.conns, c)
		h.mu.Unlock()
		return c, err
	}
}

func (h *hookLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd)
		h.args = append(h.args, fmt.Sprint(cmd.Args()))
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *hookLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.pipes = append(h.pipes, slices.Clone(cmds))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// own returns the commands (and their arguments as they entered) that
// mention key.
func (h *hookLog) own(key string) ([]redis.Cmder, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var cmds []redis.Cmder
	var args []string
	for i, c := range h.cmds {
		if strings.Contains(h.args[i], key) {
			cmds = append(cmds, c)
			args = append(args, h.args[i])
		}
	}
	return cmds, args
}

// ownPipes returns the pipelines whose first command mentions key.
func (h *hookLog) ownPipes(key string) [][]redis.Cmder {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [][]redis.Cmder
	for _, p := range h.pipes {
		if len(p) > 0 && strings.Contains(fmt.Sprint(p[0].Args()), key) {
			out = append(out, p)
		}
	}
	return out
}

// The hook redsem adds to a client does nothing to its commands: with a
// hook of the test's own outside it (added before New) and one inside it
// (added after New, when redsem's is in place), every command, pipeline and
// dial passes from the outer hook to the inner one unchanged (the same
// command values, the same arguments, the same connections), once each;
// and what Redis did with them is what the test asked (an INCR sent twice
// would count twice).
func TestPromiseClientHookChangesNothing(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		c := redis.NewClient(redistest.Shared(t).Options())
		t.Cleanup(func() { _ = c.Close() })
		outer, inner := &hookLog{}, &hookLog{}
		c.AddHook(outer)
		s := mustNew(t, v, c, name, 2, opts{LeaseTTL: 3 * time.Second})
		c.AddHook(inner) // inside redsem's: sees what redsem's hook passes on

		// The semaphore used: a grant, a status, a release.
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}

		key := "promise-hook:" + name
		if err := c.Set(ctx, key+":s", "v\x00\xff\r\nx", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Get(ctx, key+":s").Result(); err != nil || got != "v\x00\xff\r\nx" {
			t.Errorf("GET after SET: %q, %v", got, err)
		}
		if n, err := c.Incr(ctx, key+":n").Result(); err != nil || n != 1 {
			t.Errorf("first INCR: %d, %v; want 1", n, err)
		}
		pipe := c.Pipeline()
		i1 := pipe.Incr(ctx, key+":n")
		i2 := pipe.IncrBy(ctx, key+":n", 10)
		g := pipe.Get(ctx, key+":n")
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if i1.Val() != 2 || i2.Val() != 12 || g.Val() != "12" {
			t.Errorf("pipeline: INCR %d, INCRBY %d, GET %q; want 2, 12, \"12\"", i1.Val(), i2.Val(), g.Val())
		}
		t.Cleanup(func() { _ = redistest.Client(t).Del(context.Background(), key+":s", key+":n").Err() })
		// What Redis holds, read by a client with no hook at all.
		if got, err := redistest.Client(t).Get(ctx, key+":n").Result(); err != nil || got != "12" {
			t.Errorf("the counter in Redis: %q, %v; want \"12\" (each command arrived once)", got, err)
		}

		oc, oa := outer.own(key)
		ic, ia := inner.own(key)
		if len(oc) != 3 || !slices.Equal(oa, ia) || len(ic) != len(oc) {
			t.Errorf("the test's commands: outer hook saw %d %q, inner %d %q; want the same 3", len(oc), oa, len(ic), ia)
		}
		for i := range min(len(oc), len(ic)) {
			if oc[i] != ic[i] {
				t.Errorf("command %d (%s) reached the inner hook as another value", i, oa[i])
			}
		}
		op, ip := outer.ownPipes(key), inner.ownPipes(key)
		if len(op) != 1 || len(ip) != 1 || !slices.Equal(op[0], ip[0]) {
			t.Errorf("pipelines: outer %v, inner %v; want the same one, once", op, ip)
		}
		// The semaphore's own commands pass the same way (some run
		// concurrently, the policy check and the library load: compared
		// as sets, each command value once on each side).
		outer.mu.Lock()
		inner.mu.Lock()
		if len(outer.cmds) <= len(oc) || len(outer.dials) == 0 {
			t.Errorf("the hooks saw %d commands and %d dials in all: the semaphore's own are missing", len(outer.cmds), len(outer.dials))
		}
		oargs, iargs := slices.Sorted(slices.Values(outer.args)), slices.Sorted(slices.Values(inner.args))
		if !slices.Equal(oargs, iargs) {
			t.Errorf("outer hook saw %d commands, inner %d:\nouter %q\ninner %q", len(outer.cmds), len(inner.cmds), oargs, iargs)
		}
		seen := map[redis.Cmder]int{}
		for _, c := range outer.cmds {
			seen[c]++
		}
		for _, c := range inner.cmds {
			seen[c]--
		}
		for c, n := range seen {
			if n != 0 {
				t.Errorf("command %v: seen %+d more times by the outer hook than by the inner one", c.Args(), n)
			}
		}
		conns := map[net.Conn]int{}
		for _, c := range outer.conns {
			conns[c]++
		}
		for _, c := range inner.conns {
			conns[c]--
		}
		for c, n := range conns {
			if n != 0 {
				t.Errorf("connection %v: came out of redsem's dial hook %+d more times than the inner hook made it", c, n)
			}
		}
		if d1, d2 := slices.Sorted(slices.Values(outer.dials)), slices.Sorted(slices.Values(inner.dials)); !slices.Equal(d1, d2) {
			t.Errorf("dials: outer %q, inner %q", d1, d2)
		}
		inner.mu.Unlock()
		outer.mu.Unlock()
	})
}

// ---- Semaphore: fair queue and unfair clients ----

// A fair queue is never jumped by an unfair client of the same name: with a
// fair waiter for two slots queued at the head and one slot of two free,
// an unfair TryAcquire (and TryAcquireN) gets ErrNoSlot; before the waiter
// queued, and after it was served, the unfair client takes the free slot.
func TestPromiseUnfairTryAcquireDoesNotJumpFairQueue(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	name := redistest.Name(t)
	fv, uv := variants[1], variants[0]
	if fv.name != "fair" || uv.name != "unfair" {
		t.Fatal("variants in an unexpected order")
	}
	holderSem := mustNew(t, fv, redistest.Client(t), name, 2, opts{})
	waiterSem := mustNew(t, fv, redistest.Client(t), name, 2, opts{})
	u := mustNew(t, uv, redistest.Client(t), name, 2, opts{})

	held, err := holderSem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// No queue yet: the unfair client takes the free slot, and gives it back.
	ul, err := u.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("unfair TryAcquire with a slot free and no fair waiter: %v", err)
	}
	if err := ul.Release(ctx); err != nil {
		t.Fatal(err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		l   redsem.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiterSem.AcquireN(wctx, 2)
		got <- result{l, err}
	}()
	redistest.WaitFor(t, 10*time.Second, "the fair waiter for 2 queued", func() (bool, error) {
		st, err := holderSem.Status(ctx)
		return err == nil && len(st.Waiters) == 1 && st.Waiters[0].Weight == 2, err
	})
	for i := 0; i < 3; i++ {
		if l, err := u.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			if l != nil {
				_ = l.Release(ctx)
			}
			t.Fatalf("unfair TryAcquire with a fair waiter queued and one slot free: (%v, %v), want ErrNoSlot", l, err)
		}
		if l, err := u.TryAcquireN(ctx, 1); !errors.Is(err, redsem.ErrNoSlot) {
			if l != nil {
				_ = l.Release(ctx)
			}
			t.Fatalf("unfair TryAcquireN(1) with a fair waiter queued: (%v, %v), want ErrNoSlot", l, err)
		}
	}
	if st, err := holderSem.Status(ctx); err != nil || len(st.Holders) != 1 || len(st.Waiters) != 1 {
		t.Fatalf("status %+v, %v: want the one holder and the waiter", st, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-ctx.Done():
		t.Fatal("the fair waiter was not admitted after the release")
	}
	if r.err != nil {
		t.Fatalf("the fair waiter: %v", r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ul, err = u.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("unfair TryAcquire once the queue is empty: %v", err)
	}
	_ = ul.Release(ctx)
}

// ---- Semaphore: Close ----

// Leases granted before Close keep working after it: they go on renewing
// themselves (the lease outlives its deadline of the moment of Close), Renew
// moves the deadline, and Release frees the slot for another client. The
// same for a lease of a family member after the family's Close.
func TestPromiseLeasesWorkAfterClose(t *testing.T) {
	const ttl = 600 * time.Millisecond
	check := func(t *testing.T, ctx context.Context, closeIt func() error, l redsem.Lease, other redsem.Semaphore) {
		t.Helper()
		if err := closeIt(); err != nil {
			t.Fatal(err)
		}
		d0 := l.Deadline()
		// Renewed in the background past the deadline it had at Close.
		waitUntil(ctx, t, "the lease renewed past its deadline of Close", func() bool {
			return l.Deadline().After(d0.Add(ttl / 2))
		})
		waitUntil(ctx, t, "the deadline the lease had at Close passed", func() bool { return time.Now().After(d0) })
		select {
		case <-l.Done():
			t.Fatalf("lease done after Close: %v", l.Err())
		default:
		}
		if l.Err() != nil {
			t.Fatalf("lease Err %v after Close", l.Err())
		}
		if _, err := other.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
			t.Fatalf("another client while the lease is held after Close: %v, want ErrNoSlot", err)
		}
		before := l.Deadline()
		start := time.Now()
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("Renew after Close: %v", err)
		}
		if after := l.Deadline(); after.Before(before) || !after.After(start) {
			t.Errorf("Deadline after Renew %v, before %v (renew sent at %v)", after, before, start)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release after Close: %v", err)
		}
		select {
		case <-l.Done():
		default:
			t.Error("lease not done after its Release")
		}
		nl, err := other.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("another client after the Release made after Close: %v", err)
		}
		_ = nl.Release(ctx)
	}
	forEach(t, func(t *testing.T, v variant) {
		t.Run("semaphore", func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			s := mustNew(t, v, redistest.Client(t), name, 1, opts{LeaseTTL: ttl})
			other := mustNew(t, v, redistest.Client(t), name, 1, opts{LeaseTTL: ttl})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			check(t, ctx, s.Close, l, other)
			if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrClosed) {
				t.Errorf("TryAcquire after Close: %v, want ErrClosed", err)
			}
		})
		t.Run("family", func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			fam, err := newPFamilyTTL(v, redistest.Client(t), name, 1, ttl)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fam.close() })
			otherFam, err := newPFamilyTTL(v, redistest.Client(t), name, 1, ttl)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = otherFam.close() })
			l, err := fam.member(t, "k").TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			check(t, ctx, fam.close, l, otherFam.member(t, "k"))
		})
	})
}

// newPFamilyTTL is a family of variant v whose members' leases live ttl.
func newPFamilyTTL(v variant, c redis.UniversalClient, name string, limit int, ttl time.Duration) (*pFamily, error) {
	if v.name == "fair" {
		f, err := fair.NewFamily(c, name, limit, fair.FamilyOptions{Options: fair.Options{LeaseTTL: ttl}})
		if err != nil {
			return nil, err
		}
		return &pFamily{get: func(key string) (redsem.Semaphore, error) {
			s, err := f.Get(key)
			if err != nil {
				return nil, err
			}
			return s, nil
		}, setTotal: f.SetTotal, status: f.Status, close: f.Close}, nil
	}
	f, err := unfair.NewFamily(c, name, limit, unfair.FamilyOptions{Options: unfair.Options{LeaseTTL: ttl}})
	if err != nil {
		return nil, err
	}
	return &pFamily{get: func(key string) (redsem.Semaphore, error) {
		s, err := f.Get(key)
		if err != nil {
			return nil, err
		}
		return s, nil
	}, setTotal: f.SetTotal, status: f.Status, close: f.Close}, nil
}

// ---- Semaphore: the Logger ----

// The Logger logs a lost lease, an evicted fair waiter, a limit mismatch,
// an acquire failed with a Redis error and the policy warning at Warn, and
// the other events (acquired, released, acquire timed out, resumed) at
// Debug, each event as "redsem: " and its kind's String.
func TestPromiseLoggerLevels(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 60*time.Second)
		name := redistest.Name(t)
		rec := &recorder{}
		logger := slog.New(rec)
		c := srv.Client(t) // a client of its own: the policy warning is per client
		const ttl = 400 * time.Millisecond
		s := mustP(t, v, c, name, 1, popts{LeaseTTL: ttl, Logger: logger})
		other := mustP(t, v, srv.Client(t), name, 1, popts{LeaseTTL: ttl})
		expect := func(msg string) {
			t.Helper()
			waitUntil(ctx, t, "the record "+msg, func() bool { return rec.count(msg) > 0 })
		}

		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expect("DEBUG redsem: acquired")
		expect("WARN redsem: Redis maxmemory-policy may evict the semaphore's keys; use noeviction")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		expect("DEBUG redsem: released")

		// Timed out while another holds the slot.
		ol, err := other.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = s.Acquire(tctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with the slot held: %v", err)
		}
		expect("DEBUG redsem: acquire_timed_out")

		// Resumed: the other client's lease taken over and released.
		rl, err := s.Resume(ctx, ol.ID())
		if err != nil {
			t.Fatal(err)
		}
		expect("DEBUG redsem: resumed")
		if err := rl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		_ = ol.Release(ctx) // released elsewhere: nil

		if v.name == "fair" {
			// A fair waiter removed by an operator: evicted, queues again.
			ol, err = other.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := s.Acquire(ctx)
				if l != nil {
					err = errors.Join(err, l.Release(ctx))
				}
				got <- err
			}()
			var waiter string
			redistest.WaitFor(t, 10*time.Second, "the waiter queued", func() (bool, error) {
				st, err := other.Status(ctx)
				if err == nil && len(st.Waiters) == 1 {
					waiter = st.Waiters[0].ID
				}
				return waiter != "", err
			})
			if kind := forceReleaseAny(ctx, t, c, name, waiter); kind != core.ReleasedWaiter {
				t.Fatalf("force release of the waiter: kind %d", kind)
			}
			expect("WARN redsem: waiter_evicted")
			if err := ol.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the evicted waiter, queued again: %v", err)
			}
		}

		// A limit mismatch.
		ol, err = other.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := mustP(t, v, c, name, 2, popts{Logger: logger})
		if _, err := m.TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
			t.Fatalf("TryAcquire with another limit: %v", err)
		}
		expect("WARN redsem: limit_mismatch")
		if err := ol.Release(ctx); err != nil {
			t.Fatal(err)
		}

		// A lease lost: removed behind its holder's back.
		l, err = s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if kind := forceReleaseAny(ctx, t, c, name, l.ID()); kind != core.ReleasedLease {
			t.Fatalf("force release of the lease: kind %d", kind)
		}
		select {
		case <-l.Done():
		case <-ctx.Done():
			t.Fatal("the lost lease never found out")
		}
		expect("WARN redsem: lease_lost")

		// An acquire that Redis fails: the meta hash is a string.
		meta := core.KeysFor(core.DefaultPrefix, name).List[core.KeyMeta]
		if err := c.Set(ctx, meta, "not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if l, err := s.TryAcquire(ctx); err == nil || errors.Is(err, redsem.ErrNoSlot) {
			if l != nil {
				_ = l.Release(ctx)
			}
			t.Fatalf("TryAcquire on a broken key: %v, want Redis's error", err)
		}
		if err := c.Del(ctx, meta).Err(); err != nil {
			t.Fatal(err)
		}
		expect("WARN redsem: acquire_failed")

		// Nothing else: each event at its level, never the other.
		for _, m := range []string{"acquired", "released", "acquire_timed_out", "resumed"} {
			if n := rec.count("WARN redsem: " + m); n != 0 {
				t.Errorf("%s logged at Warn %d times", m, n)
			}
		}
		for _, m := range []string{"lease_lost", "waiter_evicted", "limit_mismatch", "acquire_failed"} {
			if n := rec.count("DEBUG redsem: " + m); n != 0 {
				t.Errorf("%s logged at Debug %d times", m, n)
			}
		}
		t.Logf("records: %s", rec.all())
	})
}

// ---- Family ----

// A negative IdleAfter, or Shards outside [0, 1024], is a *ConfigError
// from NewFamily, naming the field; 0 and 1024 shards are taken.
func TestPromiseFamilyValidated(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // NewFamily does no I/O
	defer c.Close()
	forEach(t, func(t *testing.T, v variant) {
		for _, tc := range []struct {
			desc      string
			idleAfter time.Duration
			shards    int
			field     string
		}{
			{"IdleAfter -1ns", -1, 0, "IdleAfter"},
			{"IdleAfter -1s", -time.Second, 0, "IdleAfter"},
			{"Shards -1", 0, -1, "Shards"},
			{"Shards 1025", 0, 1025, "Shards"},
		} {
			f, err := newPFamily(v, c, "fam", 2, tc.idleAfter, tc.shards, 0)
			var ce *redsem.ConfigError
			if f != nil || !errors.As(err, &ce) || !errors.Is(err, redsem.ErrInvalidConfig) {
				t.Errorf("%s: got (%v, %v), want a *ConfigError", tc.desc, f, err)
				continue
			}
			if ce.Field != tc.field && ce.Field != "FamilyOptions."+tc.field {
				t.Errorf("%s: field %q, want it to name %s (%v)", tc.desc, ce.Field, tc.field, err)
			}
		}
		for _, shards := range []int{0, 1, 1024} {
			f, err := newPFamily(v, c, "fam", 2, 0, shards, 0)
			if err != nil {
				t.Errorf("Shards %d: %v, want it taken", shards, err)
				continue
			}
			_ = f.close()
		}
	})
}

// A family client built with another Total than the one live clients
// established gets ErrLimitMismatch from Acquire and TryAcquire, in any
// member, while anything is held; once nothing is, it is admitted (and its
// total is then the one in force).
func TestPromiseFamilyTotalMismatch(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		f3 := mustPFamily(t, v, redistest.Client(t), name, 2, 3)
		f4 := mustPFamily(t, v, redistest.Client(t), name, 2, 4)
		l, err := f3.member(t, "a").TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"a", "b"} {
			m := f4.member(t, key)
			if got, err := m.TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
				if got != nil {
					_ = got.Release(ctx)
				}
				t.Errorf("member %s of the family built with total 4, TryAcquire while total 3 holds: %v, want ErrLimitMismatch", key, err)
			}
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			got, err := m.Acquire(actx)
			cancel()
			if !errors.Is(err, redsem.ErrLimitMismatch) || errors.Is(err, context.DeadlineExceeded) {
				if got != nil {
					_ = got.Release(ctx)
				}
				t.Errorf("member %s of the family built with total 4, Acquire while total 3 holds: %v, want ErrLimitMismatch at once", key, err)
			}
		}
		if st, err := f3.status(ctx); err != nil || st.Total != 3 || st.Held != 1 {
			t.Errorf("family status %+v, %v; want total 3 in force, 1 held", st, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l4, err := f4.member(t, "b").TryAcquire(ctx)
		if err != nil {
			t.Fatalf("the family built with total 4 once nothing is held: %v", err)
		}
		if st, err := f4.status(ctx); err != nil || st.Total != 4 || st.Held != 1 {
			t.Errorf("family status %+v, %v; want total 4 in force, 1 held", st, err)
		}
		if _, err := f3.member(t, "a").TryAcquire(ctx); !errors.Is(err, redsem.ErrLimitMismatch) {
			t.Errorf("the family built with total 3 while total 4 holds: %v, want ErrLimitMismatch", err)
		}
		_ = l4.Release(ctx)
	})
}

// ---- Resume ----

// A resumed lease's hold, in its events and for MaxHold, counts from the
// Resume, not from the grant: a handle with MaxHold 500 ms that resumes a
// lease granted a second before goes on renewing it after the Resume (it
// does not stop at once although the grant is older than MaxHold), until
// it has held it MaxHold; then it ends lost at its deadline, and its
// EventLeaseLost's Hold is at least MaxHold and no longer than the time
// since the Resume. A resumed lease released at once reports a Hold
// shorter than the time since the Resume.
func TestPromiseResumeHoldCountsFromResume(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		const (
			age     = time.Second
			maxHold = 500 * time.Millisecond
			ttl     = 600 * time.Millisecond // renewed every 200 ms
		)
		a := mustP(t, v, redistest.Client(t), name, 2, popts{LeaseTTL: ttl})
		evs := &eventLog{}
		b := mustP(t, v, redistest.Client(t), name, 2, popts{LeaseTTL: ttl, MaxHold: maxHold, Observer: evs.observe})

		la, err := a.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		waitUntil(ctx, t, "the grant is older than MaxHold", func() bool { return time.Since(granted) >= age })
		resumed := time.Now()
		lb, err := b.Resume(ctx, la.ID())
		if err != nil {
			t.Fatal(err)
		}
		d0 := lb.Deadline()
		// Renewed after the Resume, though the grant is a second old.
		waitUntil(ctx, t, "the resumed handle renewed, or ended", func() bool {
			select {
			case <-lb.Done():
				return true
			default:
			}
			return lb.Deadline().After(d0)
		})
		if !lb.Deadline().After(d0) {
			t.Fatalf("the resumed handle (MaxHold %v) never renewed after the Resume: MaxHold counted from the grant %v before", maxHold, time.Since(granted).Round(time.Millisecond))
		}
		select {
		case <-lb.Done():
		case <-ctx.Done():
			t.Fatal("the resumed handle never stopped: MaxHold not applied")
		}
		if !errors.Is(lb.Err(), redsem.ErrLeaseLost) {
			t.Errorf("resumed handle after MaxHold: Err %v, want ErrLeaseLost", lb.Err())
		}
		since := time.Since(resumed)
		t.Logf("the resumed handle ended %v after the Resume", since.Round(time.Millisecond))
		if last := lb.Deadline(); last.Before(resumed.Add(maxHold)) {
			t.Errorf("the resumed handle's last deadline %v after the Resume, want it renewed until MaxHold (%v)", last.Sub(resumed), maxHold)
		}
		var hold time.Duration
		waitUntil(ctx, t, "EventLeaseLost of the resumed handle", func() bool {
			evs.mu.Lock()
			defer evs.mu.Unlock()
			for _, ev := range evs.evs {
				if ev.Kind == redsem.EventLeaseLost && ev.LeaseID == la.ID() {
					hold = ev.Hold
					return true
				}
			}
			return false
		})
		if hold < maxHold || hold > since {
			t.Errorf("EventLeaseLost Hold %v, want from the Resume: at least MaxHold %v and at most %v (the grant was %v before the Resume)",
				hold, maxHold, since, resumed.Sub(granted).Round(time.Millisecond))
		}

		// Released at once through a resumed handle: a Hold of about nothing.
		lc, err := a.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		granted = time.Now()
		waitUntil(ctx, t, "the grant is a second old", func() bool { return time.Since(granted) >= age })
		resumed = time.Now()
		rc, err := b.Resume(ctx, lc.ID())
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.Release(ctx); err != nil {
			t.Fatal(err)
		}
		since = time.Since(resumed)
		hold = -1
		evs.mu.Lock()
		for _, ev := range evs.evs {
			if ev.Kind == redsem.EventReleased && ev.LeaseID == lc.ID() {
				hold = ev.Hold
			}
		}
		evs.mu.Unlock()
		if hold < 0 || hold > since {
			t.Errorf("EventReleased Hold %v of a lease released right after its Resume, want at most %v (the grant was %v before)",
				hold, since, resumed.Sub(granted).Round(time.Millisecond))
		}
		_ = la.Release(ctx)
		_ = lc.Release(ctx)
	})
}

// Status shows as a lease's Owner the process that holds it now: after
// another process resumed it, that process (issue 44: before, the first
// process stayed its owner, and `redsem status` showed a process that had
// handed the lease on).
func TestPromiseResumeOwnerIsHolder(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 30*time.Second)
		name := redistest.Name(t)
		front := mustP(t, v, redistest.Client(t), name, 1, popts{Owner: "front"})
		worker := mustP(t, v, redistest.Client(t), name, 1, popts{Owner: "worker"})
		l, err := front.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		owners := func() []string {
			t.Helper()
			st, err := worker.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, h := range st.Holders {
				out = append(out, h.Owner)
			}
			return out
		}
		if got := owners(); !slices.Equal(got, []string{"front"}) {
			t.Fatalf("owners %q before the Resume", got)
		}
		r, err := worker.Resume(ctx, l.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got := owners(); !slices.Equal(got, []string{"worker"}) {
			t.Errorf("owners %q after the worker's Resume, want [worker]: the process that holds it now", got)
		}
		if err := r.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if got := owners(); !slices.Equal(got, []string{"worker"}) {
			t.Errorf("owners %q after the worker renewed, want [worker]", got)
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := owners(); len(got) != 0 {
			t.Errorf("owners %q after the release", got)
		}
	})
}
