package redsem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// errMyCause is the cause the caller gives its context.
var errMyCause = errors.New("caller's own cause")

// Acquire's error keeps both what ended the context and why: with a
// context from WithTimeoutCause or WithCancelCause, a blocked Acquire
// returns an error that matches ctx.Err() (DeadlineExceeded or Canceled)
// and the cause, and leaves nothing queued.
func TestAcquireErrorCarriesContextCause(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			o := prefixed{Prefix: uniquePrefix(), LeaseTTL: 10 * time.Second}
			holder := newPrefixed(t, variant, redistest.Client(t), name, 1, o)
			wc := redistest.Client(t)
			sent := &commandSeen{}
			wc.AddHook(sent)
			waiter := newPrefixed(t, variant, wc, name, 1, o)
			l, err := holder.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()

			t.Run("WithTimeoutCause", func(t *testing.T) {
				tctx, cancel := context.WithTimeoutCause(ctx, 100*time.Millisecond, errMyCause)
				defer cancel()
				_, err := waiter.Acquire(tctx)
				if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errMyCause) {
					t.Errorf("Acquire: %v; want an error matching both context.DeadlineExceeded and the cause", err)
				}
				if !errors.Is(err, tctx.Err()) {
					t.Errorf("Acquire: %v does not match ctx.Err() = %v", err, tctx.Err())
				}
				assertNotQueued(ctx, t, holder)
			})
			t.Run("WithCancelCause", func(t *testing.T) {
				// The cancel lands while the call waits (fair: queued;
				// unfair: between attempts); the error must carry the cause.
				cctx, cancel := context.WithCancelCause(ctx)
				done := make(chan error, 1)
				seen := sent.arm()
				go func() {
					_, err := waiter.Acquire(cctx)
					done <- err
				}()
				// Cancel an Acquire that made its first attempt (so it is
				// waiting, or about to wait, not refusing an ended ctx at
				// once); fair: one that certainly waits in the queue.
				select {
				case <-seen:
				case <-ctx.Done():
					t.Fatal("the waiter sent no command")
				}
				if variant == "fair" {
					waitUntil(ctx, t, "the waiter is queued", func() bool {
						st, err := holder.Status(ctx)
						return err == nil && len(st.Waiters) == 1
					})
				}
				cancel(errMyCause)
				err := <-done
				if !errors.Is(err, context.Canceled) || !errors.Is(err, errMyCause) {
					t.Errorf("Acquire: %v; want an error matching both context.Canceled and the cause", err)
				}
				assertNotQueued(ctx, t, holder)
			})
		})
	}
}

// An Acquire made inside Do's fn after Do's lease was lost returns an
// error that matches the Err of the context fn was given (Canceled, with
// the cause ErrLeaseLost), as Acquire's contract says for any ended ctx.
func TestAcquireInDoAfterLeaseLost(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			c := redistest.Client(t)
			o := prefixed{Prefix: uniquePrefix(), LeaseTTL: 300 * time.Millisecond}
			outer := newPrefixed(t, variant, redistest.Client(t), name, 2, o)
			inner := newPrefixed(t, variant, redistest.Client(t), name+"-inner", 2, o)
			var fnErr, acqErr error
			err := redsem.Do(ctx, outer, func(fctx context.Context, l redsem.Lease) error {
				// Lose the lease: delete the semaphore's whole state; the
				// lease's next renewal finds it gone.
				if n := deleteAll(ctx, t, c, o.Prefix); n == 0 {
					t.Fatal("no key under the semaphore's prefix")
				}
				select {
				case <-fctx.Done():
				case <-ctx.Done():
					t.Fatal("fn's context was not cancelled after the lease was lost")
				}
				fnErr = fctx.Err()
				if !errors.Is(context.Cause(fctx), redsem.ErrLeaseLost) {
					t.Errorf("cause of fn's context: %v, want ErrLeaseLost", context.Cause(fctx))
				}
				for _, s := range []redsem.Semaphore{outer, inner} {
					l2, err := s.Acquire(fctx)
					if err == nil {
						_ = l2.Release(ctx)
						t.Errorf("%s: Acquire with fn's ended context succeeded", s.Name())
						continue
					}
					if !errors.Is(err, fctx.Err()) {
						t.Errorf("%s: Acquire in fn after the lease was lost: %v; want an error matching fn's ctx.Err() = %v",
							s.Name(), err, fctx.Err())
					}
					acqErr = err
				}
				return nil
			})
			if !errors.Is(err, redsem.ErrLeaseLost) {
				t.Errorf("Do: %v, want ErrLeaseLost", err)
			}
			t.Logf("fn's ctx.Err() = %v; inner Acquire: %v", fnErr, acqErr)
		})
	}
}

// assertNotQueued fails unless s's Status shows no waiter: a cancelled or
// timed-out Acquire leaves nothing behind.
// The cancelled Acquire's queue entry goes at once by design: its undo runs
// detached from the ended context, so it is waited for here (briefly).
func assertNotQueued(ctx context.Context, t *testing.T, s redsem.Semaphore) {
	t.Helper()
	var st redsem.Status
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if st, err = s.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if len(st.Waiters) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if len(st.Waiters) != 0 || len(st.Holders) != 1 {
		t.Errorf("after the cancelled Acquire: %d waiters, %d holders; want 0 and the 1 holder", len(st.Waiters), len(st.Holders))
	}
}

// commandSeen is a go-redis hook that tells when a client has completed a
// command since it was armed.
type commandSeen struct {
	mu sync.Mutex
	ch chan struct{} // closed at the first command after arm; nil: not armed
}

// arm returns a channel closed once the next command completes.
func (h *commandSeen) arm() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ch = make(chan struct{})
	return h.ch
}

func (h *commandSeen) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.mu.Lock()
		if h.ch != nil {
			close(h.ch)
			h.ch = nil
		}
		h.mu.Unlock()
		return err
	}
}

func (h *commandSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
