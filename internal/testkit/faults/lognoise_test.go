package faults_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// goRedisLog counts the lines go-redis logs that name one address, and
// writes every line to stderr as go-redis's default logger does.
type goRedisLog struct {
	mu    sync.Mutex
	addr  string
	lines []string
	out   *log.Logger
}

func (l *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	l.mu.Lock()
	if l.addr != "" && strings.Contains(s, l.addr) {
		l.lines = append(l.lines, s)
	}
	l.mu.Unlock()
	_ = l.out.Output(2, s)
}

func (l *goRedisLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// During an outage, redsem's own work (leases renewing, a release given
// up to the background, fair waiters and their session, the subscription)
// does not flood go-redis's log: go-redis logs a line for each request
// whose dials all failed ("failed to dial after 5 attempts"), and the
// logger is the user's. redsem tries the address itself, without a log,
// while the client's dials fail, and hands a request to go-redis only once
// a dial got through (issue 44: 43 lines in a 6 s outage from two
// processes). The caller's own calls still fail with the dial's error
// (ErrUnavailable).
func TestOutageDoesNotFloodGoRedisLog(t *testing.T) {
	srv := redistest.Start(t)
	logger := &goRedisLog{addr: srv.Addr, out: log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}
	redis.SetLogger(logger)
	t.Cleanup(func() {
		redis.SetLogger(&goRedisLog{out: log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)})
	})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr}) // go-redis's defaults: 5 dials per connection, 3 retries
	t.Cleanup(func() { _ = c.Close() })
	ctx := redistest.Ctx(t, 60*time.Second)
	var held []interface{ Release(context.Context) error }
	var sems []closer
	var waiting sync.WaitGroup
	wctx, stopWaiting := context.WithCancel(ctx)
	defer func() { stopWaiting(); waiting.Wait() }()
	for _, v := range variants {
		s := v.new(t, c, redistest.Name(t)+"-"+v.name, 3, opts{LeaseTTL: 1500 * time.Millisecond, QueueTTL: time.Second})
		sems = append(sems, s)
		for range 3 {
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		for range 2 { // waiters, retrying through the outage
			waiting.Add(1)
			go func() {
				defer waiting.Done()
				if l, err := s.Acquire(wctx); err == nil {
					_ = l.Release(ctx)
				}
			}()
		}
	}
	time.Sleep(200 * time.Millisecond) // the waiters queued
	srv.Kill(t)
	time.Sleep(300 * time.Millisecond)
	// A release given up to the background while Redis is away.
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_ = held[0].Release(rctx)
	cancel()
	time.Sleep(2700 * time.Millisecond) // leases renewing and lost, waiters retrying
	lines := logger.count()
	srv.Restart(t)
	// Once Redis answers again, a call goes through at once: no older
	// failure refuses it (the state a probe result shared between calls
	// would leave for a moment).
	for _, s := range sems {
		if _, err := s.Status(ctx); err != nil {
			t.Errorf("Status right after Redis came back: %v", err)
		}
	}
	t.Logf("go-redis logged %d lines naming %s in a 3 s outage", lines, srv.Addr)
	if lines > 4 {
		t.Errorf("go-redis logged %d lines naming %s in a 3 s outage of 6 leases, 4 waiters and a background release; want at most 4 (requests in flight when it began)", lines, srv.Addr)
	}
}

// Callers that try again and again while Redis refuses connections (20
// goroutines, a TryAcquire every 5 ms for 1.5 s) leave nothing behind
// that competes with the calls made once Redis is back: a request that
// the dial gate refused never left, so no undo runs for it. Found from
// outside: each refused TryAcquire started an undo that retried for
// LeaseTTL, thousands of them ran at once when Redis came back, and 10 of
// 10 Acquire calls on a semaphore with free slots timed out (1 s).
func TestRetryStormLeavesNothingForRecovery(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = c.Close() })
			ctx := redistest.Ctx(t, 60*time.Second)
			busy := v.new(t, c, redistest.Name(t)+"-busy", 1, opts{})
			free := v.new(t, c, redistest.Name(t)+"-free", 10, opts{})
			if _, err := free.Status(ctx); err != nil { // scripts loaded
				t.Fatal(err)
			}
			// busy's engine has heard from Redis (its clock is known), so
			// that its calls go as far as the acquire request itself.
			l, err := busy.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			base := runtime.NumGoroutine()
			srv.Kill(t)
			stop := time.Now().Add(1500 * time.Millisecond)
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						if l, err := busy.TryAcquire(tctx); err == nil {
							_ = l.Release(tctx)
						}
						cancel()
						time.Sleep(5 * time.Millisecond)
					}
				}()
			}
			wg.Wait()
			// What the refused calls left running: before, an undo each
			// (thousands, retrying for LeaseTTL).
			t.Logf("goroutines: %d before the storm, %d after", base, runtime.NumGoroutine())
			if left := runtime.NumGoroutine() - base; left > 200 {
				t.Errorf("%d goroutines more than before the storm of refused calls, want at most 200", left)
			}
			srv.Restart(t)
			var slow []string
			for i := range 10 {
				// 2 s: go-redis, once as many dials as its pool size failed,
				// answers its last dial error for up to a second before it
				// dials again (its own breaker; redsem cannot reset it).
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				start := time.Now()
				l, err := free.Acquire(actx)
				cancel()
				if err != nil {
					slow = append(slow, fmt.Sprintf("#%d after %v: %v", i, time.Since(start).Round(time.Millisecond), err))
					continue
				}
				_ = l.Release(ctx)
			}
			if len(slow) > 0 {
				t.Fatalf("Acquire (2 s, free slots) right after Redis came back, behind a storm of refused calls: %d of 10 failed: %s",
					len(slow), strings.Join(slow, "; "))
			}
		})
	}
}
