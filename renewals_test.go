package redsem_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// scriptCalls counts the script calls a server ran (FCALL, EVALSHA, EVAL,
// and their read-only forms), from INFO commandstats.
func scriptCalls(ctx context.Context, t testing.TB, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_evalsha_ro", "cmdstat_eval", "cmdstat_eval_ro":
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			v, err := strconv.Atoi(calls)
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			n += v
		}
	}
	return n
}

// A process renews all its leases of a semaphore together: one script call
// per renewal interval, however many leases it holds, with every lease kept
// (none lost, every Deadline moved on). Many leases held for long are the
// case where renewals were most of Redis's work (1 000 leases of 30 s,
// renewed every 10 s, were 100 calls a second).
func TestRenewalsOneCallPerInterval(t *testing.T) {
	const leases = 1000
	const ttl = 1500 * time.Millisecond // renewed every 500 ms (CI runs it with -race, beside other packages)
	const hold = 6 * ttl / 3            // six intervals
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel() // a server of its own
			ctx := redistest.Ctx(t, 60*time.Second)
			srv := redistest.Start(t)
			c := srv.Client(t)
			s := newPrefixed(t, variant, c, redistest.Name(t), leases, prefixed{Prefix: uniquePrefix(), LeaseTTL: ttl})
			held := make([]redsem.Lease, 0, leases)
			defer func() {
				for _, l := range held {
					_ = l.Release(ctx)
				}
			}()
			for range leases {
				l, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}
			first := make([]time.Time, leases)
			for i, l := range held {
				first[i] = l.Deadline()
			}
			before := scriptCalls(ctx, t, c)
			time.Sleep(hold)
			calls := scriptCalls(ctx, t, c) - before
			for i, l := range held {
				if err := l.Err(); err != nil {
					t.Fatalf("lease %d: %v after %v of renewals", i, err, hold)
				}
				if !l.Deadline().After(first[i]) {
					t.Fatalf("lease %d: Deadline %v not moved on from %v", i, l.Deadline(), first[i])
				}
			}
			perLease := leases * int(hold/(ttl/3))
			if calls*10 > perLease {
				t.Errorf("%d script calls while %d leases were renewed for %v: want at most a tenth of one call per lease and renewal (%d)",
					calls, leases, hold, perLease/10)
			}
			t.Logf("%d leases, TTL %v, %v: %d script calls (one call per lease and renewal would be %d): %s per second",
				leases, ttl, hold, calls, perLease, fmt.Sprintf("%.1f", float64(calls)/hold.Seconds()))
		})
	}
}

// holdFirstReply is a go-redis hook that holds back the reply of the first
// call that match selects (Redis ran it) until the caller gives up on it:
// a connection gone dead after the request went out.
type holdFirstReply struct {
	match redistest.Match
	held  atomic.Bool
	ended chan time.Duration // how long the held call waited
}

func (h *holdFirstReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdFirstReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.match(cmd) && h.held.CompareAndSwap(false, true) {
			start := time.Now()
			<-ctx.Done()
			h.ended <- time.Since(start)
			return ctx.Err()
		}
		return err
	}
}
func (h *holdFirstReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// One renewal call that Redis never answers (its reply lost on a dead
// connection, with no ReadTimeout to end it) neither holds up the renewal
// of the process's other leases of the semaphore, which fall due while it
// waits, nor costs its own leases: it is given up after a third of the
// TTL, and they are renewed again in a new call before their deadline.
// (Before: while one call waited, the other leases' renewals waited for it
// and were lost at their deadline, as were the leases of the call.)
func TestRenewalsOutliveOneUnansweredCall(t *testing.T) {
	const ttl = 900 * time.Millisecond // renewed every 300 ms, together within 150 ms
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel() // a semaphore and a client of its own
			ctx := redistest.Ctx(t, 30*time.Second)
			hold := &holdFirstReply{match: redistest.MatchScript(lua.RenewMany.Hash(), lua.RenewMany.Function()), ended: make(chan time.Duration, 1)}
			c := redistest.Client(t)
			c.AddHook(hold)
			s := newPrefixed(t, variant, c, redistest.Name(t), 100, prefixed{Prefix: uniquePrefix(), LeaseTTL: ttl})
			var leases []redsem.Lease
			defer func() {
				for _, l := range leases {
					_ = l.Release(ctx)
				}
			}()
			// Two groups, 200 ms apart: each renewed in calls of its own.
			for group := range 2 {
				if group == 1 {
					time.Sleep(200 * time.Millisecond)
				}
				for range 20 {
					l, err := s.TryAcquire(ctx)
					if err != nil {
						t.Fatal(err)
					}
					leases = append(leases, l)
				}
			}
			time.Sleep(3 * ttl)
			select {
			case d := <-hold.ended:
				t.Logf("the unanswered renewal call was given up after %v", d)
			default:
				t.Fatal("no renewal call was held: the test did not reach its state")
			}
			for i, l := range leases {
				if err := l.Err(); err != nil {
					t.Fatalf("lease %d (group %d): %v, after one renewal call went unanswered", i, i/20, err)
				}
			}
		})
	}
}
