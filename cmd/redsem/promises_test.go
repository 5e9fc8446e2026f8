package main

// Tests of promises that docs/promises.md listed as gaps for the redsem
// command, each running the command (run, in-process) against a real
// redis-server, for both variants where the promise holds for both.

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// runOn runs the command in-process against the server at addr.
func runOn(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append(args, "--redis", "redis://"+addr), &out, &errb)
	return code, out.String(), errb.String()
}

// statusOn runs status with args against addr, failing the test unless it
// exits 0 with nothing on stderr.
func statusOn(t *testing.T, addr string, args ...string) string {
	t.Helper()
	code, out, errs := runOn(t, addr, append([]string{"status"}, args...)...)
	if code != exitOK || errs != "" {
		t.Fatalf("status %v: exit %d, stderr %q", args, code, errs)
	}
	return out
}

// semOpts are the options these tests set; both variants take them.
type semOpts struct {
	LeaseTTL         time.Duration
	DisableAutoRenew bool
	Owner            string
}

// newSem builds a semaphore of variant v ("fair" or "unfair"), closed
// when the test ends.
func newSem(t *testing.T, v string, c redis.UniversalClient, name string, limit int, o semOpts) redsem.Semaphore {
	t.Helper()
	var (
		s   redsem.Semaphore
		err error
	)
	if v == "fair" {
		s, err = fair.New(c, name, limit, fair.Options{LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew, Owner: o.Owner})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.LeaseTTL, DisableAutoRenew: o.DisableAutoRenew, Owner: o.Owner})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// once fails the test unless out contains want exactly once.
func once(t *testing.T, out, want string) {
	t.Helper()
	if n := strings.Count(out, want); n != 1 {
		t.Errorf("status shows %q %d times, want once:\n%s", want, n, out)
	}
}

// TestPromiseStatusWarnings: status warns, each once, of a semaphore over
// its limit and of a holder whose slot is outside it (after SetLimit
// lowered the limit below what is held), of a holder without a lease
// record (its record deleted by hand), of a holder expiring in under 0.2 x
// LeaseTTL (a DisableAutoRenew lease near its deadline, with --lease-ttl),
// and of an evicting maxmemory-policy (operations.md §1). On a server of
// its own, whose policy the test changes.
func TestPromiseStatusWarnings(t *testing.T) {
	for _, v := range []string{"fair", "unfair"} {
		t.Run(v, func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 30*time.Second)

			// Over the limit, and a slot outside it.
			name := redistest.Name(t)
			s := newSem(t, v, c, name, 2, semOpts{})
			var leases []redsem.Lease
			for range 2 {
				l, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
				leases = append(leases, l)
			}
			if out := statusOn(t, srv.Addr, name); strings.Contains(out, "over the limit") || strings.Contains(out, "outside the limit") {
				t.Fatalf("warnings before the limit was lowered:\n%s", out)
			}
			if err := s.SetLimit(ctx, 1); err != nil {
				t.Fatal(err)
			}
			out := statusOn(t, srv.Addr, name)
			t.Logf("limit lowered to 1 under 2 holders:\n%s", out)
			once(t, out, "over the limit: 2 slots held, limit 1")
			outside := leases[0]
			if leases[1].Slot() == 1 {
				outside = leases[1]
			}
			once(t, out, "holder "+outside.ID()+" holds slot 1, outside the limit 1")
			if n := strings.Count(out, "outside the limit"); n != 1 {
				t.Errorf("%d holders said to be outside the limit, want 1", n)
			}

			// A holder whose lease record was deleted by hand.
			gone := leases[0]
			meta := core.KeysFor(core.DefaultPrefix, name).List[core.KeyMeta]
			if n, err := c.HDel(ctx, meta, gone.ID()).Result(); err != nil || n != 1 {
				t.Fatalf("deleting the lease record of %s: %d, %v", gone.ID(), n, err)
			}
			out = statusOn(t, srv.Addr, name)
			t.Logf("a lease record deleted:\n%s", out)
			once(t, out, "holder "+gone.ID()+" has no lease record")

			// A holder expiring in under 0.2 x LeaseTTL.
			const ttl = 3 * time.Second // under 0.2 x: its last 600 ms
			name2 := redistest.Name(t)
			s2 := newSem(t, v, c, name2, 1, semOpts{LeaseTTL: ttl, DisableAutoRenew: true})
			l2, err := s2.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l2.Release(context.Background())
			const late = "under 0.2 x LeaseTTL (3s)"
			if out := statusOn(t, srv.Addr, name2, "--lease-ttl", "3s"); strings.Contains(out, late) {
				t.Fatalf("a fresh holder said to expire soon:\n%s", out)
			}
			redistest.WaitFor(t, ttl, "status to warn that the holder expires in under 0.2 x LeaseTTL", func() (bool, error) {
				out = statusOn(t, srv.Addr, name2, "--lease-ttl", "3s")
				return strings.Contains(out, late), nil
			})
			t.Logf("a holder near its deadline:\n%s", out)
			once(t, out, "holder "+l2.ID()+" (slot 0) expires in ")
			once(t, out, late)

			// An evicting maxmemory-policy.
			const policy = "Redis maxmemory-policy is allkeys-lru"
			if out := statusOn(t, srv.Addr, name); strings.Contains(out, "maxmemory-policy") {
				t.Fatalf("a policy warning under noeviction:\n%s", out)
			}
			if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				t.Fatal(err)
			}
			out = statusOn(t, srv.Addr, name)
			once(t, out, policy)
			var snap snapshot
			_, js, _ := runOn(t, srv.Addr, "status", name, "--json")
			if err := json.Unmarshal([]byte(js), &snap); err != nil || snap.MaxMemoryPolicy != "allkeys-lru" {
				t.Errorf("status --json: policy %q (%v), want allkeys-lru", snap.MaxMemoryPolicy, err)
			}
		})
	}
}

// TestPromiseStatusAgeAfterClockStepBack: after the server's clock steps
// back past a holder's grant, its token is ahead of the clock: status shows
// its age as "?" (no lower bound can be derived) and --json a null
// min_age_ms (reliability.md §The server's clock steps; operations.md §1).
func TestPromiseStatusAgeAfterClockStepBack(t *testing.T) {
	for _, v := range []string{"fair", "unfair"} {
		t.Run(v, func(t *testing.T) {
			srv, clock := redistest.StartWallClock(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			s := newSem(t, v, c, name, 1, semOpts{})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
			jsonAge := func() *int64 {
				t.Helper()
				code, out, errs := runOn(t, srv.Addr, "status", name, "--json")
				var snap snapshot
				if code != exitOK || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Holders) != 1 {
					t.Fatalf("status --json: exit %d, stderr %q:\n%s", code, errs, out)
				}
				return snap.Holders[0].MinAgeMs
			}
			// row matches the holder's row with an AGE that age (a regular
			// expression) matches.
			row := func(age string) *regexp.Regexp {
				return regexp.MustCompile(`(?m)^\s+0\s+` + itoa64(l.Token()) + `\s+` + age + `\s+.*` + regexp.QuoteMeta(l.ID()) + `$`)
			}
			if age := jsonAge(); age == nil {
				t.Fatal("min_age_ms null before any clock step")
			}
			if out := statusOn(t, srv.Addr, name); !row(`>=\S+`).MatchString(out) {
				t.Fatalf("no holder row with an age >= before the step:\n%s", out)
			}
			clock.Step(-2 * time.Second)
			out := statusOn(t, srv.Addr, name)
			t.Logf("after a step back of 2 s:\n%s", out)
			if !row(`\?`).MatchString(out) {
				t.Errorf("the holder's AGE is not ? after the clock stepped back past its grant:\n%s", out)
			}
			if age := jsonAge(); age != nil {
				t.Errorf("min_age_ms %d after the step back, want null", *age)
			}
		})
	}
}

// TestPromiseReleaseFairWaiter: release NAME ID of a fair waiter removes
// it from the queue and says so; its Acquire goes on (not cancelled),
// queues again at the back, behind a waiter that queued after it, and is
// granted in that order (operations.md §1; design.md §State transitions).
// Fair only: Redis stores no unfair waiter.
func TestPromiseReleaseFairWaiter(t *testing.T) {
	ctx := redistest.Ctx(t, 60*time.Second)
	name := redistest.Name(t)
	holder := newSem(t, "fair", redistest.Client(t), name, 1, semOpts{Owner: "holder"})
	l, err := holder.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		owner string
		l     redsem.Lease
		err   error
	}
	got := make(chan grant, 2)
	wait := func(owner string) {
		s := newSem(t, "fair", redistest.Client(t), name, 1, semOpts{Owner: owner})
		go func() {
			l, err := s.Acquire(ctx)
			got <- grant{owner, l, err}
		}()
	}
	owners := func() []string {
		st, err := holder.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var o []string
		for _, w := range st.Waiters {
			o = append(o, w.Owner)
		}
		return o
	}
	wait("first")
	waitFor(t, 10*time.Second, "the first waiter to queue", func() bool { return len(owners()) == 1 })
	wait("second")
	waitFor(t, 10*time.Second, "the second waiter to queue behind the first", func() bool {
		return strings.Join(owners(), ",") == "first,second"
	})
	st, err := holder.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := st.Waiters[0].ID

	code, out, errs := runCmd(t, "release", name, first[:8]) // a unique prefix
	if code != exitOK || errs != "" {
		t.Fatalf("release of a waiter: exit %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, "removed waiter "+first+" from the queue of") || !strings.Contains(out, "its process will queue it again, at the back") {
		t.Fatalf("release of a waiter says:\n%s", out)
	}
	waitFor(t, 20*time.Second, "the released waiter to queue again, behind the second", func() bool {
		return strings.Join(owners(), ",") == "second,first"
	})
	select {
	case g := <-got:
		t.Fatalf("the %s waiter's Acquire returned (%v) while the slot was held", g.owner, g.err)
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"second", "first"} {
		select {
		case g := <-got:
			if g.err != nil || g.owner != want {
				t.Fatalf("granted %s (%v), want %s next", g.owner, g.err, want)
			}
			if err := g.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the %s waiter was not granted", want)
		}
	}
}

// TestPromiseStatusFamilyOverLoweredTotal: status FAMILY warns, once, of a
// family whose total was lowered below the slots its members hold
// (operations.md §1), in text and in the JSON's warnings.
func TestPromiseStatusFamilyOverLoweredTotal(t *testing.T) {
	for _, v := range []string{"fair", "unfair"} {
		t.Run(v, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			fam := redistest.Name(t)
			c := redistest.Client(t)
			var (
				get      func(key string) (redsem.Semaphore, error)
				setTotal func(context.Context, int) error
			)
			if v == "fair" {
				f, err := fair.NewFamily(c, fam, 3, fair.FamilyOptions{Total: 3})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				get = func(k string) (redsem.Semaphore, error) { return f.Get(k) }
				setTotal = f.SetTotal
			} else {
				f, err := unfair.NewFamily(c, fam, 3, unfair.FamilyOptions{Total: 3})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				get = func(k string) (redsem.Semaphore, error) { return f.Get(k) }
				setTotal = f.SetTotal
			}
			for _, key := range []string{"a", "b", "c"} {
				s, err := get(key)
				if err != nil {
					t.Fatal(err)
				}
				l, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
			}
			const over = "over the family's total: 3 slots held in all members, total 1"
			if _, out, _ := runCmd(t, "status", fam); strings.Contains(out, "over the family's total") {
				t.Fatalf("over the total before it was lowered:\n%s", out)
			}
			if err := setTotal(ctx, 1); err != nil {
				t.Fatal(err)
			}
			code, out, errs := runCmd(t, "status", fam)
			if code != exitOK || errs != "" {
				t.Fatalf("status %s: exit %d, stderr %q", fam, code, errs)
			}
			t.Logf("status %s:\n%s", fam, out)
			once(t, out, over)
			_, js, _ := runCmd(t, "status", fam, "--json")
			var snap snapshot
			if err := json.Unmarshal([]byte(js), &snap); err != nil || snap.Kind != kindFamily {
				t.Fatalf("status --json %s: %v:\n%s", fam, err, js)
			}
			n := 0
			for _, w := range snap.Warnings {
				if strings.HasPrefix(w, over) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("the JSON's warnings %q have the over-total warning %d times, want once", snap.Warnings, n)
			}
		})
	}
}
