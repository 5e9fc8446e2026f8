package redsemotel_test

// A test of a promise of the package doc that docs/promises.md named only
// the package's goroutine-leak check for, through Wrap, on real
// semaphores of both variants.

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
)

// holdWatchers counts the goroutines that wait for a wrapped lease's end
// (the one hold starts per lease).
func holdWatchers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "redsemotel.(*semaphore).hold.func")
}

// TestPromiseHoldGoroutineEndsWithLease: nothing runs after a lease ends
// (package doc §Leases): the goroutine that waits for a wrapped lease's
// Done runs while the lease is held and ends with the lease, released or
// lost (its keys deleted, found at a renewal), while the semaphore stays
// open.
func TestPromiseHoldGoroutineEndsWithLease(t *testing.T) {
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			c := redistest.Client(t)
			name := redistest.Name(t)
			sem := redsemotel.Wrap(newBase(t, variant, c, name))
			gone := func(what string) {
				t.Helper()
				redistest.WaitFor(t, 5*time.Second, what, func() (bool, error) { return holdWatchers() == 0, nil })
			}
			gone("no lease held yet")

			l, err := sem.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := holdWatchers(); n != 1 {
				t.Fatalf("%d goroutines wait for the held lease's end, want 1", n)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			gone("the goroutine of a released lease to end")

			l, err = sem.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Del(ctx, core.KeysFor(core.DefaultPrefix, name).List...).Err(); err != nil {
				t.Fatal(err)
			}
			if err := l.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("Renew after the keys were deleted: %v, want ErrLeaseLost", err)
			}
			<-l.Done()
			gone("the goroutine of a lost lease to end")
		})
	}
}
