package redistest_test

import (
	"testing"
	"time"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

// TestWallClockSteps: a step of a server's wall clock moves what the
// semaphore's scripts rely on, and nothing else: TIME (in a script too),
// key expiry, both when a key is read and by the server's own expiry cycle;
// while the server's timers, which run on its monotonic clock, keep running
// through a step back of an hour (the expiry cycle, part of serverCron,
// still removes a key unread).
func TestWallClockSteps(t *testing.T) {
	s, clock := redistest.StartWallClock(t)
	rdb := s.Client(t)
	ctx := redistest.Ctx(t, 30*time.Second)

	ahead := func() time.Duration {
		t.Helper()
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return time.Until(now)
	}
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if got < want-time.Second || got > want+time.Second {
			t.Fatalf("%s: the server's clock is %v ahead, want %v", what, got, want)
		}
	}
	near("at start", ahead(), 0)
	clock.Step(90 * time.Second)
	near("after +90s", ahead(), 90*time.Second)
	us, err := rdb.Eval(ctx, "local t = redis.call('TIME') return tonumber(t[1])", nil).Int64()
	if err != nil {
		t.Fatal(err)
	}
	near("in a script", time.Until(time.Unix(us, 0)), 90*time.Second)

	// Expiry follows: a key set for a minute is gone after a step of 90 s,
	// and one set for a minute before a step back of 90 s has 2.5 minutes.
	if err := rdb.Set(ctx, "a", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Step(-90 * time.Second)
	near("after -90s", ahead(), 0)
	if ttl := rdb.PTTL(ctx, "a").Val(); ttl < 140*time.Second || ttl > 150*time.Second {
		t.Fatalf("a key set for 60 s before a step back of 90 s has TTL %v, want about 150 s", ttl)
	}
	if err := rdb.Set(ctx, "b", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Step(90 * time.Second)
	if n := rdb.Exists(ctx, "b").Val(); n != 0 {
		t.Fatalf("a key set for 60 s exists after a step of 90 s")
	}

	// Timers: after a step back of an hour, a key that expires in 50 ms is
	// removed by the expiry cycle without being read (DBSIZE counts keys
	// without expiring them).
	clock.Step(-time.Hour)
	if err := rdb.Set(ctx, "c", "1", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, "the expiry cycle to remove an unread key", func() (bool, error) {
		n, err := rdb.DBSize(ctx).Result()
		return n == 1, err // "a" remains
	})

	// The offset survives a restart: a restart does not fix the clock.
	s.Restart(t)
	rdb = s.Client(t)
	near("after a restart", ahead(), clock.Offset())
}
