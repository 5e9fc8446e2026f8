package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func uuidParse(s string) (uuid.UUID, error) { return uuid.Parse(s) }

func TestDoReleasesOnReturnErrorAndPanic(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		s := mustNew(t, v, redistest.Client(t), redistest.Name(t), 1, opts{})
		free := func() {
			t.Helper()
			st, err := s.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 0 {
				t.Fatalf("slot still held after Do: %+v", st.Holders)
			}
		}
		var seen redsem.Lease
		if err := redsem.Do(ctx, s, func(ctx context.Context, l redsem.Lease) error {
			seen = l
			st, _ := s.Status(ctx)
			if len(st.Holders) != 1 || st.Holders[0].ID != l.ID() || st.Holders[0].Token != l.Token() {
				t.Errorf("inside Do, status %+v", st)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-seen.Done():
		default:
			t.Error("lease not done after Do")
		}
		free()

		boom := errors.New("boom")
		if err := redsem.Do(ctx, s, func(context.Context, redsem.Lease) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do returned %v, want fn's error", err)
		}
		free()

		func() {
			defer func() {
				if r := recover(); r != "kaboom" {
					t.Fatalf("recovered %v, want the panic re-raised", r)
				}
			}()
			_ = redsem.Do(ctx, s, func(context.Context, redsem.Lease) error { panic("kaboom") })
		}()
		free()

		// A cancelled parent context still lets Do release.
		cctx, cancel := context.WithCancel(ctx)
		err := redsem.Do(cctx, s, func(ctx context.Context, l redsem.Lease) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do after cancel: %v", err)
		}
		free()
	})
}

// When the lease is lost while fn runs, fn's context is cancelled with
// ErrLeaseLost as its cause, and Do reports the loss.
func TestDoCancelsOnLeaseLoss(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		c := redistest.Client(t)
		s := mustNew(t, v, c, redistest.Name(t), 1, opts{LeaseTTL: 150 * time.Millisecond})
		err := redsem.Do(ctx, s, func(fctx context.Context, l redsem.Lease) error {
			// Remove the lease behind its back: the watchdog finds it gone.
			st, _ := s.Status(ctx)
			if len(st.Holders) != 1 {
				t.Fatalf("status %+v", st)
			}
			if err := forceRelease(ctx, c, s, l.ID()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-fctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("fn's context not cancelled after the lease was lost")
			}
			if cause := context.Cause(fctx); !errors.Is(cause, redsem.ErrLeaseLost) {
				t.Errorf("cause %v, want ErrLeaseLost", cause)
			}
			return nil
		})
		if !errors.Is(err, redsem.ErrLeaseLost) {
			t.Fatalf("Do returned %v, want ErrLeaseLost", err)
		}
	})
}

// forceRelease removes a lease from Redis behind its holder's back, as
// "redsem release NAME ID" does.
func forceRelease(ctx context.Context, c *redis.Client, s redsem.Semaphore, id string) error {
	e, err := core.New(core.Config{Client: c, Name: s.Name(), Limit: 1, Prefix: core.DefaultPrefix})
	if err != nil {
		return err
	}
	defer e.Close()
	kind, _, err := e.ForceRelease(ctx, id)
	if err == nil && kind != core.ReleasedLease {
		err = fmt.Errorf("force release of %s: kind %d, want a lease", id, kind)
	}
	return err
}
