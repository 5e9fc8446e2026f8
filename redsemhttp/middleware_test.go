package redsemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/internal/testkit/stale"
	"github.com/redsem/redsem/redsemhttp"
	"github.com/redsem/redsem/unfair"
)

// TestMiddlewareLimitAcrossProcesses: this process and a child process
// serve the same route behind Middleware with one semaphore of limit 3;
// 12 requests split over both never have more than 3 handlers running.
func TestMiddlewareLimitAcrossProcesses(t *testing.T) {
	const limit, requests = 3, 12
	srv := redistest.Shared(t)
	name := redistest.Name(t)
	sem := newFair(t, redistest.Client(t), name, limit, fair.Options{})
	tr := newTracker(t)
	mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem)})
	parent := httptest.NewServer(mw(callTracker(tr.URL + "/hold?from=parent")))
	t.Cleanup(func() { tr.open(); parent.Close() }) // no handler left waiting
	child := startChild(t, srv.Addr, name, limit, tr.URL)

	client := &http.Client{Timeout: 20 * time.Second}
	results := make(chan error, requests)
	for i := 0; i < requests; i++ {
		url := parent.URL
		if i%2 == 1 {
			url = child
		}
		go func() {
			resp, err := client.Get(url)
			if err != nil {
				results <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s: %d %s", url, resp.StatusCode, b)
			}
			results <- err
		}()
	}
	// Three handlers are inside, the other nine wait in the queue, and no
	// fourth handler has started.
	tr.waitEntered(t, limit)
	waitCounts(t, sem, limit, requests-limit)
	if n := tr.inflight.Load(); n != limit {
		t.Fatalf("%d handlers running, limit %d", n, limit)
	}
	tr.open()
	for i := 0; i < requests; i++ {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if m := tr.max.Load(); m > limit {
		t.Fatalf("%d handlers ran at once, limit %d", m, limit)
	}
	if e := tr.entries(); e["parent"] != requests/2 || e["child"] != requests/2 {
		t.Fatalf("entries %v, want %d from each process", e, requests/2)
	}
	wantCounts(t, sem, 0, 0)
}

// serve runs h on a request with ctx and returns the recorded response.
func serve(h http.Handler, ctx context.Context) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
	return rec
}

func want503(t *testing.T, rec *httptest.ResponseRecorder, retryAfter string) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d (%s), want 503", rec.Code, rec.Body)
	}
	if got := rec.Header().Get("Retry-After"); got != retryAfter {
		t.Fatalf("Retry-After %q, want %q", got, retryAfter)
	}
}

// TestMiddlewareReleases: the lease is released on every path, and a
// request that gets none never reaches the handler.
func TestMiddlewareReleases(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	sem := newFair(t, redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	var calls atomic.Int64
	var seen redsem.Lease
	var holdersInside int
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		l, ok := redsemhttp.LeaseFromContext(r.Context())
		if !ok {
			t.Error("handler runs without a lease")
			return
		}
		seen = l
		st, err := sem.Status(r.Context())
		if err != nil {
			t.Error(err)
		}
		holdersInside = len(st.Holders)
		switch r.URL.Query().Get("do") {
		case "panic":
			panic("handler panic")
		case "error":
			http.Error(w, "handler failed", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 5 * time.Second})(inner)

	t.Run("ok", func(t *testing.T) {
		rec := serve(h, ctx)
		if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
			t.Fatalf("%d %q", rec.Code, rec.Body)
		}
		wantCounts(t, sem, 0, 0)
		if holdersInside != 1 {
			t.Fatalf("%d holders while the handler ran, want 1", holdersInside)
		}
		if seen.Err() != nil {
			t.Fatalf("lease: %v", seen.Err())
		}
	})
	t.Run("error", func(t *testing.T) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?do=error", nil).WithContext(ctx))
		if rec.Code != http.StatusInternalServerError {
			t.Fatalf("status %d", rec.Code)
		}
		wantCounts(t, sem, 0, 0)
	})
	t.Run("panic", func(t *testing.T) {
		func() {
			defer func() {
				if r := recover(); r != "handler panic" {
					t.Fatalf("recovered %v, want the handler's panic", r)
				}
			}()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/?do=panic", nil).WithContext(ctx))
			t.Fatal("the panic did not go on")
		}()
		wantCounts(t, sem, 0, 0)
	})
	t.Run("MaxWait", func(t *testing.T) {
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(ctx) }()
		before := calls.Load()
		short := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 50 * time.Millisecond})(inner)
		want503(t, serve(short, ctx), "1")
		if calls.Load() != before {
			t.Fatal("handler called without a lease")
		}
		wantCounts(t, sem, 1, 0) // no queue entry left behind
	})
	t.Run("client gone while waiting", func(t *testing.T) {
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(ctx) }()
		before := calls.Load()
		reqCtx, cancel := context.WithCancel(ctx)
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- serve(h, reqCtx) }()
		waitCounts(t, sem, 1, 1)
		cancel()
		want503(t, <-done, "1")
		if calls.Load() != before {
			t.Fatal("handler called without a lease")
		}
		wantCounts(t, sem, 1, 0)
	})
	t.Run("RetryAfter rounds up", func(t *testing.T) {
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(ctx) }()
		mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: time.Millisecond, RetryAfter: 1500 * time.Millisecond})
		want503(t, serve(mw(inner), ctx), "2")
	})
}

// queueFull is a real semaphore whose Acquire reports a full queue, as a
// fair semaphore with MaxWaiters does.
type queueFull struct{ redsem.Semaphore }

func (queueFull) Acquire(context.Context) (redsem.Lease, error) {
	return nil, fmt.Errorf("fair: %w", redsem.ErrQueueFull)
}

// TryAcquire finds no slot free (a full queue waits behind busy slots).
func (queueFull) TryAcquire(context.Context) (redsem.Lease, error) {
	return nil, redsem.ErrNoSlot
}

func TestMiddlewareQueueFull(t *testing.T) {
	sem := newFair(t, redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	var called atomic.Bool
	h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(queueFull{sem}), FailOpen: true, RetryAfter: 3 * time.Second})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }))
	// A full queue is not a failure of the limiter: 503 even with FailOpen.
	want503(t, serve(h, context.Background()), "3")
	if called.Load() {
		t.Fatal("handler called")
	}
}

// rateLimited is a real semaphore whose Acquire reports the refusal of a
// rate that had room again in 2.2 s.
type rateLimited struct{ redsem.Semaphore }

func (rateLimited) Acquire(context.Context) (redsem.Lease, error) {
	return nil, &redsem.RateLimitedError{Name: "x", Rate: redsem.Rate{Limit: 5, Per: time.Minute}, RetryAfter: 2200 * time.Millisecond}
}

func (r rateLimited) TryAcquire(ctx context.Context) (redsem.Lease, error) { return r.Acquire(ctx) }

// A request refused by a rate is answered 429 with the Retry-After the rate
// gives (rounded up to whole seconds), not Options.RetryAfter.
func TestMiddlewareRateLimited(t *testing.T) {
	sem := newFair(t, redistest.Client(t), redistest.Name(t), 1, fair.Options{})
	var called atomic.Bool
	h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(rateLimited{sem}), FailOpen: true, RetryAfter: 7 * time.Second})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }))
	rec := serve(h, context.Background())
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("status %d, Retry-After %q: want 429 and 3", rec.Code, rec.Header().Get("Retry-After"))
	}
	if called.Load() {
		t.Fatal("handler called")
	}
}

// TestMiddlewareRateWindow: a request that a real semaphore's rate (5 per
// 10 s) holds back past MaxWait while a slot is free is answered 429 Too
// Many Requests, with a Retry-After that tells when the window has room
// (not Options.RetryAfter): a client that obeys it is not refused again by
// the same window (a request that the slots hold back stays 503:
// TestMiddlewareReleases).
func TestMiddlewareRateWindow(t *testing.T) {
	const per = 10 * time.Second
	rate := redsem.Rate{Limit: 5, Per: per}
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			var sem redsem.Semaphore
			if variant == "fair" {
				sem = newFair(t, redistest.Client(t), redistest.Name(t), 10, fair.Options{Rate: rate})
			} else {
				s, err := unfair.New(redistest.Client(t), redistest.Name(t), 10, unfair.Options{Rate: rate})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				sem = s
			}
			h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 100 * time.Millisecond})(
				http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
			start := time.Now()
			for i := range rate.Limit {
				if rec := serve(h, ctx); rec.Code != http.StatusOK {
					t.Fatalf("request %d: %d %q", i, rec.Code, rec.Body)
				}
			}
			// Three at once: on the fair variant the first queues at the
			// head and the others behind it, all held by the window.
			recs := make(chan *httptest.ResponseRecorder, 3)
			for range cap(recs) {
				go func() { recs <- serve(h, ctx) }()
			}
			for range cap(recs) {
				rec := <-recs
				// The window has room once the first grant, made after
				// start, is per old: not before start+per.
				least := max(int64((per-time.Since(start))/time.Second), 2)
				if rec.Code != http.StatusTooManyRequests {
					t.Fatalf("status %d (%s, Retry-After %q), want 429", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
				}
				got, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
				if err != nil || got < least || got > int64(per/time.Second) {
					t.Fatalf("Retry-After %q, want the window's time, in [%d, %d] s", rec.Header().Get("Retry-After"), least, per/time.Second)
				}
			}
		})
	}
}

// TestMiddlewareRedisUnreachable: with Redis down the middleware fails
// closed (503) by default and runs the handler without a lease with
// FailOpen.
func TestMiddlewareRedisUnreachable(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1,
		DialTimeout: time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	sem, err := unfair.New(client, redistest.Name(t), 2, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx := redistest.Ctx(t, 10*time.Second)
	var calls, withLease atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if _, ok := redsemhttp.LeaseFromContext(r.Context()); ok {
			withLease.Add(1)
		}
		_, _ = io.WriteString(w, "served")
	})

	// Acquire rides out the refused connections until MaxWait, then gives
	// up with an error matching redsem.ErrUnavailable.
	closed := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 300 * time.Millisecond})(handler)
	want503(t, serve(closed, ctx), "1")
	if calls.Load() != 0 {
		t.Fatal("fail closed: handler called")
	}

	// FailOpen: every request is served at once while Redis refuses
	// connections, the first one included (before issue 44, each waited
	// MaxWait: 200 requests in 0.30 s with a 200 ms MaxWait and a 100 ms
	// handler; then the first still did).
	const maxWait = time.Second
	open := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: maxWait, FailOpen: true})(handler)
	for i := range 5 {
		start := time.Now()
		rec := serve(open, ctx)
		took := time.Since(start)
		if rec.Code != http.StatusOK || rec.Body.String() != "served" {
			t.Fatalf("fail open: %d %q", rec.Code, rec.Body)
		}
		if took >= maxWait/2 {
			t.Fatalf("fail open: request %d served after %v while Redis refuses connections (MaxWait %v): it waited again", i, took, maxWait)
		}
	}
	if calls.Load() != 5 || withLease.Load() != 0 {
		t.Fatalf("fail open: %d calls, %d with a lease; want 5, 0", calls.Load(), withLease.Load())
	}
}

func TestMiddlewareSemaphoreError(t *testing.T) {
	pickErr := errors.New("unknown tenant")
	pick := func(*http.Request) (redsem.Semaphore, error) { return nil, pickErr }
	var called atomic.Bool
	handler := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) })

	rec := serve(redsemhttp.Middleware(redsemhttp.Options{Semaphore: pick})(handler), context.Background())
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	var got error
	custom := redsemhttp.Middleware(redsemhttp.Options{Semaphore: pick,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			http.Error(w, "no such tenant", http.StatusNotFound)
		}})
	if rec := serve(custom(handler), context.Background()); rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want the ErrorHandler's 404", rec.Code)
	}
	if !errors.Is(got, pickErr) || got.Error() != "redsemhttp: choose semaphore: unknown tenant" {
		t.Fatalf("ErrorHandler got %v", got)
	}
	none := func(*http.Request) (redsem.Semaphore, error) { return nil, nil }
	if rec := serve(redsemhttp.Middleware(redsemhttp.Options{Semaphore: none})(handler), context.Background()); rec.Code != http.StatusInternalServerError {
		t.Fatalf("nil semaphore: status %d, want 500", rec.Code)
	}
	if called.Load() {
		t.Fatal("handler called")
	}
}

// The rate takes over from the limit: a burst of 20 against limit 5 and
// rate 5/2 s; 5 are served (their handlers hold ~75 ms), the others queue
// behind the limit and, once the 5 release, are held by the rate's window
// until MaxWait. They must be answered 429 with the window's Retry-After
// (the reason that held them last), not 503 "no slot free". Before issue
// 44 the fair waiters, queued behind the limit and then held back by the
// window, gave up with the limit's reason: 15 answered 503, Retry-After 1.
func TestMiddlewareRateAfterLimit(t *testing.T) {
	rate := redsem.Rate{Limit: 5, Per: 2 * time.Second}
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			var sem redsem.Semaphore
			if variant == "fair" {
				sem = newFair(t, redistest.Client(t), redistest.Name(t), 5, fair.Options{Rate: rate})
			} else {
				s, err := unfair.New(redistest.Client(t), redistest.Name(t), 5, unfair.Options{Rate: rate})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				sem = s
			}
			h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 300 * time.Millisecond})(
				http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					time.Sleep(75 * time.Millisecond)
					_, _ = io.WriteString(w, "ok")
				}))
			recs := make(chan *httptest.ResponseRecorder, 20)
			for range cap(recs) {
				go func() { recs <- serve(h, ctx) }()
			}
			codes := map[int]int{}
			for range cap(recs) {
				rec := <-recs
				codes[rec.Code]++
				if rec.Code == http.StatusTooManyRequests {
					if got, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64); err != nil || got < 1 || got > 2 {
						t.Errorf("429 with Retry-After %q, want the window's, 1-2 s", rec.Header().Get("Retry-After"))
					}
				}
			}
			if codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 15 {
				t.Fatalf("answers %v, want 5 served (200) and 15 held by the rate (429)", codes)
			}
		})
	}
}

// TestMiddlewareRateRemovedIs503: once SetRate removed the rate, a request
// that the slots alone hold back past MaxWait is answered 503, not 429,
// even when news of the former rate's full window reaches the process late
// (a freed-slot notice published before SetRate ran, held on the
// subscription's connection past its reply). Before the notice said when
// its script ran, the unfair variant answered 429 with the removed rate's
// Retry-After.
func TestMiddlewareRateRemovedIs503(t *testing.T) {
	rate := redsem.Rate{Limit: 2, Per: 10 * time.Second}
	for _, variant := range []string{"fair", "unfair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 20*time.Second)
			c, d := redistest.HoldingClient(t) // only stale.RateRemoved's hold
			var sem redsem.Semaphore
			if variant == "fair" {
				sem = newFair(t, c, redistest.Name(t), 3, fair.Options{Rate: rate})
			} else {
				s, err := unfair.New(c, redistest.Name(t), 3, unfair.Options{Rate: rate})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				sem = s
			}
			ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
			// The request that the window holds back waits as long as
			// stale.RateRemoved lets it.
			long := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 5 * time.Second})(ok)
			stale.RateRemoved(t, ctx, sem, c, d, func(ctx context.Context) { serve(long, ctx) })
			h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), MaxWait: 3 * redistest.MaxDelay})(ok)
			if rec := serve(h, ctx); rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d (%s, Retry-After %q), want 503: the slots held it back, the rate is gone", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
			}
		})
	}
}
