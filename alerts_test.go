package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// recorder is a slog.Handler that keeps every record's message.
type recorder struct {
	mu    sync.Mutex
	msgs  []string
	times []time.Time // of each record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	r.times = append(r.times, time.Now())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// count returns how many records carry msg (level and message).
func (r *recorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// warnings returns the Warn records, each with its time since the first
// record.
func (r *recorder) warnings() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i, m := range r.msgs {
		if strings.HasPrefix(m, "WARN ") {
			out = append(out, fmt.Sprintf("%v %s", r.times[i].Sub(r.times[0]).Round(time.Millisecond), m))
		}
	}
	return strings.Join(out, "; ")
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "; ")
}

// defaultLogger makes slog.Default() a recorder for the test.
func defaultLogger(t *testing.T) *recorder {
	rec := &recorder{}
	old := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(old) })
	return rec
}

// With Options{} (no Logger, no Observer), Redis becoming unreachable is
// logged once at Warn through slog.Default() however many calls fail, and
// once again when it is reachable again; the Observer tells it apart from
// a timeout. (Issue 20: a Warn-level logger showed nothing while every
// request failed.)
func TestUnreachableSeenWithZeroConfig(t *testing.T) {
	rec := defaultLogger(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	var kinds []redsem.EventKind
	var mu sync.Mutex
	s, err := unfair.New(c, redistest.Name(t), 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	watched, err := unfair.New(c, redistest.Name(t)+"-o", 1, unfair.Options{Observer: func(ev redsem.Event) {
		mu.Lock()
		kinds = append(kinds, ev.Kind)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := redistest.Ctx(t, 20*time.Second)
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)

	srv.Kill(t)
	for range 5 {
		if _, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrUnavailable) {
			t.Fatalf("TryAcquire with Redis down: %v, want ErrUnavailable", err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = watched.Acquire(actx)
	cancel()
	if !errors.Is(err, redsem.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with Redis down: %v, want ErrUnavailable and the deadline", err)
	}
	if n := rec.count("WARN redsem: Redis unreachable"); n != 1 {
		t.Fatalf("%d Warn records for one outage in a minute, want 1: %s", n, rec.all())
	}
	srv.Restart(t)
	if _, err := s.TryAcquire(ctx); err != nil {
		t.Fatalf("TryAcquire after the restart: %v", err)
	}
	if n := rec.count("WARN redsem: Redis reachable again"); n != 1 {
		t.Fatalf("%d records of the recovery, want 1: %s", n, rec.all())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kinds) == 0 || kinds[len(kinds)-1] != redsem.EventUnavailable {
		t.Fatalf("events %v: want the Acquire to end with EventUnavailable, not a timeout", kinds)
	}
}

// The docs of Options.Logger (both variants) and docs/operations.md's
// section on logs say what TestUnreachableSeenWithZeroConfig shows: a nil
// Logger is not silent, the conditions go to slog.Default() at Warn. (Issue
// 33: both said "nil is silent".)
func TestLoggerDocsSayNilIsNotSilent(t *testing.T) {
	ops, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	logs, _, _ := strings.Cut(string(ops[strings.Index(string(ops), "## 2. Metrics and logs"):]), "\n## 3.")
	docs := map[string]string{
		"fair.Options.Logger":   fieldDocs(t, "fair/semaphore.go", "Options")["Logger"],
		"unfair.Options.Logger": fieldDocs(t, "unfair/semaphore.go", "Options")["Logger"],
		"docs/operations.md, 2": logs,
	}
	for where, doc := range docs {
		flat := strings.ReplaceAll(strings.Join(strings.Fields(doc), " "), "`", "")
		if strings.Contains(strings.ToLower(flat), "nil: silent") || strings.Contains(flat, "nil is silent") ||
			!strings.Contains(flat, "slog.Default() at Warn") {
			t.Errorf("%s does not say that a nil Logger logs the conditions through slog.Default() at Warn:\n%.300s", where, doc)
		}
	}
}

// A restart of Redis under load (holders renewing, waiters on both
// variants, one client) is one outage: one "unreachable" Warn record, and
// one "reachable again" once Redis answers and no call fails to reach it
// any more, however the calls in flight across the restart fail and
// succeed in between. (Issue 33: 3-4 unreachable/reachable pairs per
// process in the second after a restart.)
func TestUnreachableOncePerRestart(t *testing.T) {
	rec := &recorder{}
	log := slog.New(rec)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx, stop := context.WithCancel(redistest.Ctx(t, 60*time.Second))
	var sems []redsem.Semaphore
	for i := range 4 {
		name := redistest.Name(t)
		var s redsem.Semaphore
		var err error
		if i%2 == 0 {
			s, err = fair.New(c, name, 2, fair.Options{Logger: log, LeaseTTL: time.Second})
		} else {
			s, err = unfair.New(c, name, 2, unfair.Options{Logger: log, LeaseTTL: time.Second})
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		sems = append(sems, s)
	}
	var wg sync.WaitGroup
	for i := range 12 {
		s := sems[i%len(sems)]
		wg.Go(func() {
			for ctx.Err() == nil {
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				l, err := s.Acquire(actx)
				cancel()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				time.Sleep(30 * time.Millisecond) // work, while the watchdog renews
				rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				_ = l.Release(rctx)
				cancel()
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	const down, up = "WARN redsem: Redis unreachable", "WARN redsem: Redis reachable again"
	redistest.WaitFor(t, 10*time.Second, "grants before the outage", func() (bool, error) {
		return rec.count("DEBUG redsem: acquired") >= 20, nil
	})
	srv.Kill(t)
	redistest.WaitFor(t, 10*time.Second, "the outage seen", func() (bool, error) { return rec.count(down) > 0, nil })
	time.Sleep(500 * time.Millisecond) // calls fail for a while
	srv.Restart(t)
	granted := rec.count("DEBUG redsem: acquired")
	redistest.WaitFor(t, 20*time.Second, "the recovery seen", func() (bool, error) { return rec.count(up) > 0, nil })
	redistest.WaitFor(t, 10*time.Second, "grants after the restart", func() (bool, error) {
		return rec.count("DEBUG redsem: acquired") >= granted+20, nil
	})
	stop()
	wg.Wait()
	t.Logf("warnings: %s", rec.warnings())
	if d, u := rec.count(down), rec.count(up); d != 1 || u != 1 {
		t.Errorf("one restart logged %d unreachable and %d reachable-again records, want 1 and 1: %s", d, u, rec.warnings())
	}
	for _, s := range sems {
		_ = s.(interface{ Close() error }).Close()
	}
	_ = c.Close()
	// go-redis probes a server whose dials kept failing once a second, on
	// a goroutine that ends at the first probe after the client closed.
	waitGone(t, "(*ConnPool).tryDial")
}

// waitGone waits (at most 5 s) until no goroutine runs any of funcs:
// go-redis goes on with dials that their callers abandoned, on goroutines
// of its own, after its client closed, for a second or so.
func waitGone(t *testing.T, funcs ...string) {
	t.Helper()
	redistest.WaitFor(t, 5*time.Second, "go-redis's goroutines to end", func() (bool, error) {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, f := range funcs {
			if strings.Contains(stacks, f) {
				return false, nil
			}
		}
		return true, nil
	})
}

// A maxmemory-policy that may evict the keys, and a server that refuses to
// tell it (CONFIG not allowed to the user), each give one Warn record with
// zero configuration; a Logger, when given, gets them instead.
func TestPolicyWarningsWithZeroConfig(t *testing.T) {
	rec := defaultLogger(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	evicting := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	s, err := unfair.New(evicting.Client(t), redistest.Name(t), 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	for range 3 {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
	}
	const evictWarn = "WARN redsem: Redis maxmemory-policy may evict the semaphore's keys; use noeviction"
	redistest.WaitFor(t, 5*time.Second, "the eviction-policy warning", func() (bool, error) {
		return rec.count(evictWarn) > 0, nil
	})

	// A user that may run scripts but not CONFIG.
	locked := redistest.Start(t)
	admin := locked.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	app := redis.NewClient(&redis.Options{Addr: locked.Addr, Username: "app", Password: "secret"})
	t.Cleanup(func() { _ = app.Close() })
	own := &recorder{}
	s2, err := unfair.New(app, redistest.Name(t), 1, unfair.Options{Logger: slog.New(own)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	l, err := s2.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	const refusedWarn = "WARN redsem: cannot read maxmemory-policy; make sure it is noeviction, or the semaphore's keys may be evicted"
	redistest.WaitFor(t, 5*time.Second, "the refused-check warning", func() (bool, error) {
		return own.count(refusedWarn) > 0, nil
	})
	if n := rec.count(evictWarn); n != 1 {
		t.Fatalf("%d eviction-policy warnings, want 1: %s", n, rec.all())
	}
	if n := rec.count(refusedWarn); n != 0 {
		t.Fatalf("the refused check went to slog.Default although a Logger was given: %s", rec.all())
	}
	if n := own.count(refusedWarn); n != 1 {
		t.Fatalf("%d refused-check warnings, want 1: %s", n, own.all())
	}
}
