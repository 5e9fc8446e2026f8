package redsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// rwLease is one grant as the test saw it: its token (server µs: the time
// the rate's window keeps for it) and its weight.
type rwLease struct {
	token int64
	n     int
}

// rwShortLived is a semaphore of either variant whose leases last ttl and
// are never renewed.
func rwShortLived(t *testing.T, variant string, c redis.UniversalClient, name string, limit int, rate redsem.Rate, ttl time.Duration) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	if variant == "fair" {
		s, err = fair.New(c, name, limit, fair.Options{Rate: rate, LeaseTTL: ttl, DisableAutoRenew: true})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{Rate: rate, LeaseTTL: ttl, DisableAutoRenew: true})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func rwServerUs(ctx context.Context, t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// rwRoomAt is when the window has room for n more slots at server µs now,
// by the grants it holds then (tokens above now - per): the token of the
// grant whose leaving makes room, plus per; ok false if n fits now.
func rwRoomAt(grants []rwLease, limit, n int, per time.Duration, now int64) (at int64, ok bool) {
	perUs := per.Microseconds()
	sum := 0
	for _, g := range grants {
		if g.token > now-perUs {
			sum += g.n
		}
	}
	if sum+n <= limit {
		return 0, false
	}
	need, acc := sum+n-limit, 0
	for _, g := range grants {
		if g.token > now-perUs {
			acc += g.n
			if acc >= need {
				return g.token + perUs, true
			}
		}
	}
	return 0, false
}

// rwCeilMs is us in whole ms rounded up, never below 0.
func rwCeilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

// rwExpectRetryAfter makes a TryAcquireN(n) that the rate must refuse and
// checks its RetryAfter: the script ran at a server µs u in [before, after]
// (read from the server around the call) and reports when the grants the
// window holds make room for n, from u, rounded up to whole ms.
func rwExpectRetryAfter(ctx context.Context, t *testing.T, c redis.UniversalClient, s redsem.Semaphore, grants []rwLease, rate redsem.Rate, n int) {
	t.Helper()
	before := rwServerUs(ctx, t, c)
	l, err := s.TryAcquireN(ctx, n)
	after := rwServerUs(ctx, t, c)
	for _, g := range grants {
		if edge := g.token + rate.Per.Microseconds(); edge > before && edge <= after {
			t.Fatalf("TryAcquireN(%d) ran while grant %d left the window: too late to check (machine too slow)", n, g.token)
		}
	}
	at, ok := rwRoomAt(grants, rate.Limit, n, rate.Per, before)
	if !ok {
		t.Fatalf("test bug: the grants %v have room for %d at %d µs", grants, n, before)
	}
	if err == nil {
		t.Fatalf("TryAcquireN(%d) granted (token %d) while the window held %v: rate %v", n, l.Token(), grants, rate)
	}
	var rl *redsem.RateLimitedError
	if !errors.As(err, &rl) || !errors.Is(err, redsem.ErrRateLimited) || rl.Rate != rate {
		t.Fatalf("TryAcquireN(%d): %v, want a RateLimitedError for rate %v", n, err, rate)
	}
	lo, hi := time.Duration(rwCeilMs(at-after))*time.Millisecond, time.Duration(rwCeilMs(at-before))*time.Millisecond
	if rl.RetryAfter < lo || rl.RetryAfter > hi {
		t.Fatalf("TryAcquireN(%d) between server µs %d and %d: RetryAfter %v, want %v..%v: the window %v has room for it at %d µs (grant %d + %v)",
			n, before, after, rl.RetryAfter, lo, hi, grants, at, at-rate.Per.Microseconds(), rate.Per)
	}
}

// RetryAfter of a TryAcquireN that the rate refuses is when the window has
// room for its n slots, by the window's grants (weighted): right after the
// grants, and again after an idle stretch in which every lease expired and
// a semaphore without a rate, given the same calls, let its keys go. The
// rate's window outlives them, and refuses every request size.
func TestRateRetryAfterAcrossIdle(t *testing.T) {
	for _, variant := range rateVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			c := redistest.Client(t)
			name := redistest.Name(t)
			// The period must outlive the twin's keys (about 2 s after
			// its first call) by the time the checks take.
			rate := redsem.Rate{Limit: 5, Per: 4 * time.Second}
			const ttl = 150 * time.Millisecond
			// 10 slots: the leases (5 slots) leave room, the rate none.
			s := rwShortLived(t, variant, c, name, 10, rate, ttl)
			twin := rwShortLived(t, variant, c, name+"-twin", 10, redsem.Rate{}, ttl)
			twinKeys := core.KeysFor(core.DefaultPrefix, name+"-twin")
			var grants []rwLease
			for i, n := range []int{2, 1, 2} {
				if i > 0 {
					// 10 ms apart by the server's clock: a RetryAfter
					// one grant late is 10 ms late.
					next := grants[i-1].token + 10_000
					redistest.WaitFor(t, 10*time.Second, "the server clock to pass 10 ms", func() (bool, error) {
						now, err := c.Time(ctx).Result()
						return err == nil && now.UnixMicro() >= next, err
					})
				}
				l, err := s.TryAcquireN(ctx, n)
				if err != nil {
					t.Fatalf("TryAcquireN(%d) #%d: %v", n, i, err)
				}
				grants = append(grants, rwLease{token: l.Token(), n: n})
				if _, err := twin.TryAcquireN(ctx, n); err != nil {
					t.Fatalf("twin TryAcquireN(%d) #%d: %v", n, i, err)
				}
			}
			// 1 and 2 slots get room when the first grant (2 slots)
			// leaves, 3 with the second, 4 and 5 with the third.
			for n := 1; n <= rate.Limit; n++ {
				rwExpectRetryAfter(ctx, t, c, s, grants, rate, n)
			}
			redistest.WaitFor(t, 10*time.Second, "the twin's keys to expire", func() (bool, error) {
				n, err := c.Exists(ctx, twinKeys.List...).Result()
				return n == 0, err
			})
			if now := rwServerUs(ctx, t, c); now >= grants[0].token+rate.Per.Microseconds()-500_000 {
				t.Fatalf("the idle stretch ended %v after the first grant: too close to the %v period to check (machine too slow)",
					time.Duration(now-grants[0].token)*time.Microsecond, rate.Per)
			}
			for n := 1; n <= rate.Limit; n++ {
				rwExpectRetryAfter(ctx, t, c, s, grants, rate, n)
			}
			st, err := s.Status(ctx)
			if err != nil || st.Rate != rate || st.RateGranted != 5 || len(st.Holders) != 0 {
				t.Fatalf("Status after the idle stretch: %+v %v, want rate %v, 5 granted in the window, no holder", st, err, rate)
			}
		})
	}
}
