package redsem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// onePrefix fails the test unless err's text has exactly one "redsem: ",
// names the semaphore as who (`"db"`, or `family "f", key "k"`) right
// after it, and contains every one of want. (Issue 44: the texts said
// `redsem: "down-fair": redsem: Redis unavailable: ...` and
// `... limit in force is 2: redsem: weight outside [1, limit]`.)
func onePrefix(t *testing.T, what string, err error, who string, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	msg := err.Error()
	if n := strings.Count(msg, "redsem: "); n != 1 {
		t.Errorf("%s: %q has %d prefixes \"redsem: \", want 1", what, msg, n)
	}
	if !strings.HasPrefix(msg, "redsem: "+who+": ") {
		t.Errorf("%s: %q does not begin with %q", what, msg, "redsem: "+who+": ")
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: %q does not say %q", what, msg, w)
		}
	}
}

// Errors of a semaphore whose Redis is down, and weights above the limit:
// one prefix, the semaphore named once, the sentinel matched but its text
// not repeated after a sentence that says it all.
func TestErrorTextsOnePrefix(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := "down-" + v.name
		who := `"` + name + `"`
		dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { _ = dead.Close() })
		down := mustNew(t, v, dead, name, 2, opts{})
		_, err := down.TryAcquire(ctx)
		onePrefix(t, "TryAcquire, Redis down", err, who, "Redis unavailable: ")
		if !errors.Is(err, redsem.ErrUnavailable) {
			t.Errorf("TryAcquire, Redis down: %v does not match ErrUnavailable", err)
		}
		actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = down.Acquire(actx)
		cancel()
		onePrefix(t, "Acquire, Redis down", err, who, "gave up: context deadline exceeded", "Redis unavailable: ")
		if !errors.Is(err, redsem.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire, Redis down: %v does not match ErrUnavailable and DeadlineExceeded", err)
		}
		_, err = down.Status(ctx)
		onePrefix(t, "Status, Redis down", err, who, "Redis unavailable: ")

		s := mustNew(t, v, redistest.Client(t), redistest.Name(t), 2, opts{})
		who = `"` + s.Name() + `"`
		_, err = s.AcquireN(ctx, 3)
		onePrefix(t, "AcquireN(3) at limit 2", err, who, "3 slots wanted, but the limit in force is 2")
		if !errors.Is(err, redsem.ErrWeight) || strings.Contains(err.Error(), "weight outside") {
			t.Errorf("AcquireN(3) at limit 2: %v, want ErrWeight matched, its text not repeated", err)
		}
		_, err = s.TryAcquireN(ctx, 0)
		onePrefix(t, "TryAcquireN(0)", err, who, "0 slots wanted")
		if !errors.Is(err, redsem.ErrWeight) {
			t.Errorf("TryAcquireN(0): %v does not match ErrWeight", err)
		}
		// A script's refusal: Redis's "ERR redsem: " not said again.
		bad := mustNew(t, v, redistest.Client(t), s.Name()+"-bad", 1, opts{})
		if err := redistest.Client(t).Set(ctx, "redsem:{"+bad.Name()+"}:limit", "inf", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = bad.TryAcquire(ctx)
		onePrefix(t, "TryAcquire with a bad stored limit", err, `"`+bad.Name()+`"`, "the stored limit")
		var re redis.Error
		if !errors.As(err, &re) {
			t.Errorf("TryAcquire with a bad stored limit: %v is not a redis.Error", err)
		}
		_, err = s.Resume(ctx, "00000000-0000-0000-0000-000000000000")
		onePrefix(t, "Resume of no lease", err, who, "no live lease")
		if !errors.Is(err, redsem.ErrLeaseLost) {
			t.Errorf("Resume of no lease: %v does not match ErrLeaseLost", err)
		}
	})
}

// A member's error names its family and its key; a family's own error
// (Status) names the family, as a semaphore's names it. (Issue 44:
// `redsem: "t": 4 slots wanted, the family's total in force is 3`.)
func TestErrorTextsNameFamilyAndKey(t *testing.T) {
	for _, variant := range rateVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 20*time.Second)
			name := redistest.Name(t)
			f := newTotalFamily(t, variant, redistest.Client(t), name, 5, 3, fair.Options{})
			m, err := f.Get("t")
			if err != nil {
				t.Fatal(err)
			}
			who := `family "` + name + `", key "t"`
			_, err = m.AcquireN(ctx, 4)
			onePrefix(t, "AcquireN(4) with a total of 3", err, who, "4 slots wanted, but the family's total in force is 3")
			if !errors.Is(err, redsem.ErrWeight) {
				t.Errorf("AcquireN(4) with a total of 3: %v does not match ErrWeight", err)
			}
			_, err = m.AcquireN(ctx, 6)
			onePrefix(t, "AcquireN(6) at limit 5", err, who, "6 slots wanted")

			// Unreachable: the member's error names family and key too.
			dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
			t.Cleanup(func() { _ = dead.Close() })
			df := newTotalFamily(t, variant, dead, name, 5, 3, fair.Options{})
			dm, err := df.Get("t")
			if err != nil {
				t.Fatal(err)
			}
			_, err = dm.TryAcquire(ctx)
			onePrefix(t, "member's TryAcquire, Redis down", err, who, "Redis unavailable: ")
			_, err = df.Status(ctx)
			onePrefix(t, "family's Status, Redis down", err, `"`+name+`"`, "Redis unavailable: ")
		})
	}
}

// Rates and waits as a person writes them: "1/1m", "retry after 60s",
// not "1/1m0s" and "retry after 59.999s"; an Acquire that gave up while
// the rate held it says so after one prefix.
func TestErrorTextsRatesAndWaits(t *testing.T) {
	if got := (redsem.Rate{Limit: 1, Per: time.Minute}).String(); got != "1/1m" {
		t.Errorf("Rate{1, 1m}.String() = %q, want \"1/1m\"", got)
	}
	if got := (redsem.Rate{Limit: 10, Per: 90 * time.Minute}).String(); got != "10/1h30m" {
		t.Errorf("Rate{10, 90m}.String() = %q, want \"10/1h30m\"", got)
	}
	for _, variant := range rateVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 20*time.Second)
			name := redistest.Name(t)
			who := `"` + name + `"`
			s := mustRated(t, variant, redistest.Client(t), name, 5, redsem.Rate{Limit: 1, Per: time.Minute})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			_, err = s.TryAcquire(ctx)
			var rl *redsem.RateLimitedError
			if !errors.As(err, &rl) {
				t.Fatalf("TryAcquire over the rate: %v, want a RateLimitedError", err)
			}
			if rl.RetryAfter > time.Minute || rl.RetryAfter < 50*time.Second {
				t.Fatalf("TryAcquire over the rate: RetryAfter %v, want up to 1m", rl.RetryAfter)
			}
			onePrefix(t, "TryAcquire over the rate", err, who, "(1/1m granted)", "retry after 60s")

			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = s.Acquire(actx)
			cancel()
			onePrefix(t, "Acquire held by the rate", err, who, "gave up: context deadline exceeded; rate limit reached (1/1m granted): retry after 60s")

			other := mustRated(t, variant, redistest.Client(t), name, 5, redsem.Rate{Limit: 2, Per: time.Hour})
			_, err = other.TryAcquire(ctx)
			if !errors.Is(err, redsem.ErrLimitMismatch) || !strings.Contains(err.Error(), "rate 2/1h") ||
				!strings.Contains(err.Error(), "rate 1/1m") || strings.Contains(err.Error(), "m0s") {
				t.Errorf("rate mismatch: %v, want both rates as 2/1h and 1/1m", err)
			}
		})
	}
}

// A wrong password, or none where one is needed, matches
// ErrInvalidConfig (the client's options are wrong), not ErrUnavailable.
func TestCredentialsErrorMatchesInvalidConfig(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	srv := redistest.Start(t)
	if err := srv.Client(t).ConfigSet(ctx, "requirepass", "secret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, pass := range []string{"wrong", ""} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: pass, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		forEach(t, func(t *testing.T, v variant) {
			s := mustNew(t, v, c, redistest.Name(t), 1, opts{})
			_, err := s.TryAcquire(ctx)
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, aerr := s.Acquire(actx)
			cancel()
			calls := map[string]error{"TryAcquire": err, "Acquire": aerr}
			if pass != "" {
				// Without a password, the server may drop a long request
				// (a script sent whole) before it says why: EOF.
				_, calls["Status"] = s.Status(ctx)
			}
			for call, err := range calls {
				if !errors.Is(err, redsem.ErrInvalidConfig) || errors.Is(err, redsem.ErrUnavailable) ||
					strings.Count(err.Error(), "redsem: ") != 1 {
					t.Errorf("password %q, %s: %v, want ErrInvalidConfig (not ErrUnavailable) with one prefix", pass, call, err)
				}
			}
		})
	}
}
