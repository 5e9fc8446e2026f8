package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// The tests in this file are the longer fault tests; go test -short skips
// them (the core set in the other files always runs).
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("long fault test; skipped with -short")
	}
}

// CLIENT KILL TYPE pubsub drops the wake-up subscriptions while waiters
// wait, and the release notice is sent while they are gone: the waiters
// still get their slots, by the fallback check. The leases are long, so
// that no expiry hint can explain the wake-up.
func TestPubSubKilled(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv := redistest.Start(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			const fallback = time.Second
			o := opts{LeaseTTL: time.Minute, QueueTTL: 30 * time.Second, Fallback: fallback}
			holder := v.new(t, c, name, 2, o)
			waiter := v.new(t, c, name, 2, o)
			var held []redsem.Lease
			for i := 0; i < 2; i++ {
				l, err := holder.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}
			a, b := acquireAsync(ctx, waiter), acquireAsync(ctx, waiter)
			if v.fair {
				eventually(t, 10*time.Second, "waiters queued", func() error {
					if n, err := waitersOf(ctx, waiter); err != nil || n != 2 {
						return errorf("%d waiters, %v", n, err)
					}
					return nil
				})
			} else {
				waitBlocked(t, ctx, c, waiter, false, name)
			}
			n, err := c.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
			if err != nil || n < 1 {
				t.Fatalf("CLIENT KILL TYPE pubsub: killed %d, %v", n, err)
			}
			for _, l := range held {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The fallback is 1s (±20%); allow for a slow, shared machine,
			// but far less than the one-minute leases.
			const bound = 10 * fallback
			la := await(t, a, bound, "first waiter after CLIENT KILL")
			lb := await(t, b, bound, "second waiter after CLIENT KILL")
			for _, l := range []redsem.Lease{la, lb} {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			_ = holder.Close()
			_ = waiter.Close()
			expectNoEntries(t, c, name, o.LeaseTTL)
		})
	}
}

// A holder process stopped with SIGSTOP past its lease: others are admitted
// once its lease has expired, to the same slot with a greater token (so a
// store that keeps the highest token per slot rejects the paused holder's
// late write); on SIGCONT the paused holder finds its lease lost (Done
// closes with ErrLeaseLost; the child prints "lost").
func TestPausedHolder(t *testing.T) {
	skipShort(t)
	srv := redistest.Shared(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			const lease, queue = 1500 * time.Millisecond, time.Second
			s := v.new(t, c, name, 1, opts{LeaseTTL: lease, QueueTTL: queue, Fallback: 200 * time.Millisecond})
			h := startChild(t, v, srv.Addr, name, 1, lease, queue)
			f := h.expect(t, "held", 30*time.Second)
			slot, _ := strconv.Atoi(f[2])
			token, _ := strconv.ParseInt(f[3], 10, 64)
			if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := true
			defer func() {
				if stopped {
					_ = h.cmd.Process.Signal(syscall.SIGCONT)
				}
			}()
			st, err := s.Status(ctx)
			if err != nil || len(st.Holders) != 1 {
				t.Fatalf("status %+v, %v", st, err)
			}
			paused := st.Holders[0].Deadline
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().Before(paused.Add(-10 * time.Millisecond)) {
				t.Fatalf("admitted before the paused holder's lease ended at %v", paused)
			}
			if l.Slot() != slot || l.Token() <= token {
				t.Fatalf("new lease slot %d token %d; paused holder had slot %d token %d", l.Slot(), l.Token(), slot, token)
			}
			if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			stopped = false
			h.expect(t, "lost", 20*time.Second)
			expectHolders(t, ctx, s, l.ID())
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			expectNoEntries(t, c, name, lease+queue)
		})
	}
}

// A fair waiter in a child process is handed a slot by a release (the grant
// travels as a message, unclaimed), and the child is frozen with SIGSTOP
// right after Acquire returned, before its session's next heartbeat claims
// the grant. The session then dies and the grant is revoked, so the slot goes
// on to the next waiter: that must not happen before the Deadline the frozen
// child's lease reported, or a paused holder would trust a lease that Redis
// has already given away.
func TestPausedGrantee(t *testing.T) {
	skipShort(t)
	srv := redistest.Shared(t)
	redistest.CheckLeaks(t)
	v := variants[1]
	c := srv.Client(t)
	ctx := redistest.Ctx(t, 60*time.Second)
	const lease, queue = 4 * time.Second, 600 * time.Millisecond
	revoked := 0
	for attempt := 0; attempt < 3 && revoked == 0; attempt++ {
		name := redistest.Name(t) + strconv.Itoa(attempt)
		s := v.new(t, c, name, 1, opts{LeaseTTL: lease, QueueTTL: queue, Fallback: 200 * time.Millisecond})
		first, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := startChild(t, v, srv.Addr, name, 1, lease, queue)
		h.expect(t, "started", 30*time.Second)
		eventually(t, 10*time.Second, "the child queues", func() error {
			if n, err := waitersOf(ctx, s); err != nil || n != 1 {
				return errorf("%d waiters (%v)", n, err)
			}
			return nil
		})
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		f := h.expect(t, "held", 10*time.Second)
		if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		deadlineNs, _ := strconv.ParseInt(f[4], 10, 64)
		deadline := time.Unix(0, deadlineNs)
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := time.Now()
		if got.Before(deadline) {
			t.Fatalf("slot handed on %v before the frozen child's lease deadline (%v after its grant)",
				deadline.Sub(got), deadline.Sub(granted))
		}
		if got.Before(granted.Add(lease / 2)) {
			revoked++ // the grant was revoked with the session, not expired
		} else {
			t.Logf("attempt %d: the child's heartbeat claimed its grant before SIGSTOP; trying again", attempt)
		}
		_ = h.cmd.Process.Signal(syscall.SIGCONT)
		h.expect(t, "lost", 20*time.Second)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
	}
	if revoked == 0 {
		t.Fatal("in every attempt the grant was claimed before the child froze; nothing was tested")
	}
}

// DEL of the semaphore's keys, then FLUSHALL, while workers acquire and
// release: holders whose state vanished get ErrLeaseLost, nothing panics,
// tokens keep increasing, and the workers go on acquiring afterwards.
func TestKeysDeletedUnderLoad(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv := redistest.Start(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			s := v.new(t, c, name, 3, opts{LeaseTTL: time.Second, QueueTTL: time.Second, Fallback: 100 * time.Millisecond})

			var (
				mu        sync.Mutex
				tokens    []int64 // in the order the acquisitions began... see below
				maxBefore int64
				fault     atomic.Int32 // number of faults injected so far
				after     atomic.Int32 // acquisitions begun after the last fault
				lost      atomic.Int32
				otherErrs []error
			)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < 6; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						phase := fault.Load()
						actx, cancel := context.WithTimeout(ctx, 5*time.Second)
						l, err := s.Acquire(actx)
						cancel()
						if err != nil {
							mu.Lock()
							otherErrs = append(otherErrs, err)
							mu.Unlock()
							continue
						}
						mu.Lock()
						tokens = append(tokens, l.Token())
						if phase == 2 && l.Token() <= maxBefore {
							otherErrs = append(otherErrs, fmt.Errorf("token %d after FLUSHALL not above %d", l.Token(), maxBefore))
						}
						mu.Unlock()
						if phase == 2 {
							after.Add(1)
						}
						time.Sleep(20 * time.Millisecond)
						switch err := l.Release(ctx); {
						case errors.Is(err, redsem.ErrLeaseLost):
							lost.Add(1)
						case err != nil:
							mu.Lock()
							otherErrs = append(otherErrs, err)
							mu.Unlock()
						}
					}
				}()
			}
			keys := core.KeysFor(core.DefaultPrefix, name).List
			waitHolders := func() {
				eventually(t, 10*time.Second, "holders present", func() error {
					st, err := s.Status(ctx)
					if err != nil || len(st.Holders) == 0 {
						return errorf("%d holders, %v", len(st.Holders), err)
					}
					return nil
				})
			}
			waitHolders()
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Fatal(err)
			}
			fault.Store(1)
			waitHolders()
			mu.Lock()
			for _, tk := range tokens {
				maxBefore = max(maxBefore, tk)
			}
			mu.Unlock()
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// Acquisitions begun from now on must get tokens above every
			// token issued before the FLUSHALL.
			fault.Store(2)
			eventually(t, 20*time.Second, "service resumed", func() error {
				if n := after.Load(); n < 10 {
					return errorf("%d acquisitions after FLUSHALL", n)
				}
				return nil
			})
			close(stop)
			wg.Wait()
			if lost.Load() == 0 {
				t.Error("no holder saw ErrLeaseLost after its keys were deleted")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(otherErrs) > 0 {
				t.Fatalf("%d unexpected errors, first: %v", len(otherErrs), otherErrs[0])
			}
			t.Logf("%d acquisitions, %d leases lost", len(tokens), lost.Load())
			_ = s.Close()
			expectCleanState(t, c, name, 5*time.Second)
		})
	}
}

// The engine reads maxmemory-policy at first use and reports a policy that
// can evict the semaphore's keys through the Observer; noeviction is quiet.
func TestEvictionPolicyReported(t *testing.T) {
	skipShort(t)
	for _, policy := range []string{"allkeys-lru", "volatile-ttl", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv := redistest.Start(t, "--maxmemory-policy", policy)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 20*time.Second)
			var got atomic.Value
			obs := func(ev redsem.Event) {
				if ev.Kind == redsem.EventEvictionPolicy {
					got.Store(ev.Policy)
				}
			}
			s := variants[0].new(t, c, redistest.Name(t), 1, opts{Observer: obs})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Release(ctx)
			// The check runs beside the first request, on its own (nobody
			// waits for it), bounded at a second: watch its report for
			// that long (noeviction: nothing may come in that window).
			want := map[bool]string{true: policy, false: ""}[policy != "noeviction"]
			deadline := time.Now().Add(time.Second + 200*time.Millisecond)
			for time.Now().Before(deadline) {
				if p, _ := got.Load().(string); p != "" && p != want {
					t.Fatalf("reported policy %q, want %q", p, want)
				} else if p == want && want != "" {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if p, _ := got.Load().(string); p != want {
				t.Fatalf("reported policy %q, want %q", p, want)
			}
		})
	}
}

// Under noeviction with memory full, acquire fails with Redis's OOM error
// (the scripts are refused before they run) and leaves the semaphore's
// state exactly as it was; once memory is freed, service resumes.
func TestOutOfMemory(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			const lease = 3 * time.Second
			s := v.new(t, c, name, 2, opts{LeaseTTL: lease, NoAutoRenew: true, Fallback: 200 * time.Millisecond})
			held, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := dumpKeys(t, ctx, c, name)

			fill(t, ctx, c)
			for _, op := range []string{"TryAcquire", "Acquire"} {
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				var err error
				if op == "TryAcquire" {
					_, err = s.TryAcquire(actx)
				} else {
					_, err = s.Acquire(actx)
				}
				cancel()
				var rerr redis.Error
				if !errors.As(err, &rerr) || !strings.HasPrefix(rerr.Error(), "OOM") {
					t.Fatalf("%s with memory full: %v, want Redis's OOM error", op, err)
				}
				if after := dumpKeys(t, ctx, c, name); after != before {
					t.Fatalf("%s changed the state with memory full:\nbefore %s\nafter  %s", op, before, after)
				}
			}
			// Renewal is refused too, but the lease is not reported lost
			// while Redis merely refuses to write.
			if err := held.Renew(ctx); err == nil || errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("renew with memory full: %v, want the OOM error", err)
			}

			if err := c.Del(ctx, fillerKeys(ctx, c)...).Err(); err != nil {
				t.Fatal(err)
			}
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("after freeing memory: %v", err)
			}
			for _, x := range []redsem.Lease{l, held} {
				if err := x.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			_ = s.Close()
			expectCleanState(t, c, name, lease+3*time.Second)
		})
	}
}

// dumpKeys returns the contents (not TTLs) of the semaphore's keys.
func dumpKeys(t *testing.T, ctx context.Context, c *redis.Client, name string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range core.KeysFor(core.DefaultPrefix, name).List {
		v, err := c.Dump(ctx, k).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%q ", k[strings.LastIndexByte(k, ':')+1:], v)
	}
	return b.String()
}

const fillerPrefix = "faults-filler:"

// fill sets maxmemory just above what is used, writes filler keys until
// Redis refuses a write with OOM, then sets maxmemory below what is used (a
// refused write's own buffers are freed after it, which may bring memory
// back under the limit).
func fill(t *testing.T, ctx context.Context, c *redis.Client) {
	t.Helper()
	used, err := usedMemory(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+512<<10, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	val := strings.Repeat("x", 16<<10)
	for i := 0; ; i++ {
		err := c.Set(ctx, fillerPrefix+strconv.Itoa(i), val, 0).Err()
		if err != nil {
			if strings.HasPrefix(err.Error(), "OOM") {
				if used, err = usedMemory(ctx, c); err != nil {
					t.Fatal(err)
				}
				if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-64<<10, 10)).Err(); err != nil {
					t.Fatal(err)
				}
				return
			}
			t.Fatal(err)
		}
		if i > 10000 {
			t.Fatal("memory never filled up")
		}
	}
}

func fillerKeys(ctx context.Context, c *redis.Client) []string {
	keys, _ := c.Keys(ctx, fillerPrefix+"*").Result()
	return keys
}

func usedMemory(ctx context.Context, c redis.Cmdable) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no used_memory in INFO memory")
}
