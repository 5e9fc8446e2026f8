package redsem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// Errors say what happened, with one prefix: a missing password says that
// authentication is missing (not "Protocol error: unauthenticated multibulk
// length"); a refused script names the semaphore once (the fair variant
// used to print `redsem: "x": redsem: "x": OOM ...`). (Issue 20.)
func TestErrorsSayWhatHappened(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		name := redistest.Name(t)
		prefix := `redsem: "` + name + `"`

		locked := redistest.Start(t)
		if err := locked.Client(t).ConfigSet(ctx, "requirepass", "secret").Err(); err != nil {
			t.Fatal(err)
		}
		nopass := redis.NewClient(&redis.Options{Addr: locked.Addr, MaxRetries: -1})
		t.Cleanup(func() { _ = nopass.Close() })
		s := mustNew(t, v, nopass, name, 1, opts{})
		_, err := s.TryAcquire(ctx)
		if err == nil || !strings.Contains(err.Error(), "without authentication") ||
			strings.Count(err.Error(), prefix) != 1 {
			t.Errorf("no password: %v, want one %s and a word on authentication", err, prefix)
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = s.Acquire(actx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "without authentication") ||
			strings.Count(err.Error(), prefix) != 1 {
			t.Errorf("no password, Acquire: %v, want one %s and a word on authentication", err, prefix)
		}

		full := redistest.Start(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
		s = mustNew(t, v, full.Client(t), name, 1, opts{})
		actx, cancel = context.WithTimeout(ctx, time.Second)
		_, err = s.Acquire(actx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "OOM") || strings.Count(err.Error(), "redsem: ") != 1 {
			t.Errorf("out of memory: %v, want the OOM error with one prefix", err)
		}
	})
}

// A wrong password is reported as such (WRONGPASS), not as a missing one,
// and no maxmemory-policy warning follows it: the policy check could not
// ask, which says nothing of the policy. (Issue 33.)
func TestWrongPassword(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	srv := redistest.Start(t)
	if err := srv.Client(t).ConfigSet(ctx, "requirepass", "secret").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "wrong", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	rec := &recorder{}
	s, err := unfair.New(c, redistest.Name(t), 1, unfair.Options{Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.TryAcquire(ctx)
	actx, cancel := context.WithTimeout(ctx, time.Second)
	_, aerr := s.Acquire(actx)
	cancel()
	for call, err := range map[string]error{"TryAcquire": err, "Acquire": aerr} {
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") || !strings.Contains(err.Error(), "wrong password") ||
			strings.Contains(err.Error(), "without authentication") || errors.Is(err, redsem.ErrUnavailable) {
			t.Errorf("%s with a wrong password: %v, want an error that says the password is wrong", call, err)
		}
	}
	_ = core.EngineOf(s).MaxMemoryPolicy() // waits for the first-use check
	if strings.Contains(rec.all(), "maxmemory-policy") {
		t.Errorf("a wrong password was followed by a policy warning: %s", rec.all())
	}
}

// Do reports a lease lost while fn ran once, not once from fn's context and
// again from the release.
func TestDoSaysLostOnce(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		ctx := redistest.Ctx(t, 20*time.Second)
		c := redistest.Client(t)
		name := redistest.Name(t)
		s := mustNew(t, v, c, name, 1, opts{LeaseTTL: 300 * time.Millisecond})
		err := redsem.Do(ctx, s, func(fctx context.Context, l redsem.Lease) error {
			// Somebody removes the lease (an operator, a flush): the
			// watchdog finds it gone and fn's context ends.
			if err := c.Del(ctx, "redsem:{"+name+"}:holders").Err(); err != nil {
				return err
			}
			<-fctx.Done()
			return context.Cause(fctx)
		})
		if !errors.Is(err, redsem.ErrLeaseLost) || strings.Count(err.Error(), "lease lost") != 1 {
			t.Fatalf("Do after a loss: %q, want ErrLeaseLost said once", err)
		}
	})
}
