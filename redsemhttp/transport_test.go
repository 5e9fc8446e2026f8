package redsemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemhttp"
)

// TestTransportLimit: 8 requests through Transports sharing a limit of 2
// (two semaphore instances on two Redis clients, as two processes would
// have) never have more than 2 in flight at the server, over HTTP/1.1 and
// HTTP/2.
func TestTransportLimit(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", h2), func(t *testing.T) {
			const limit, requests = 2, 8
			name := redistest.Name(t)
			semA := newFair(t, redistest.Client(t), name, limit, fair.Options{})
			semB := newFair(t, redistest.Client(t), name, limit, fair.Options{})
			tr := newTracker(t)
			srv := httptest.NewUnstartedServer(tr.Config.Handler)
			var base *http.Transport
			if h2 {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				base = srv.Client().Transport.(*http.Transport).Clone()
				base.ForceAttemptHTTP2 = true
			} else {
				srv.Start()
				base = http.DefaultTransport.(*http.Transport).Clone()
			}
			t.Cleanup(func() { tr.open(); srv.Close() }) // no handler left waiting
			t.Cleanup(base.CloseIdleConnections)
			clients := []*http.Client{
				{Transport: &redsemhttp.Transport{Base: base, Semaphore: fixed(semA)}},
				{Transport: &redsemhttp.Transport{Base: base, Semaphore: fixed(semB)}},
			}
			results := make(chan error, requests)
			for i := 0; i < requests; i++ {
				c := clients[i%2]
				go func() {
					resp, err := c.Get(srv.URL + "/hold")
					if err != nil {
						results <- err
						return
					}
					b, err := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					switch {
					case err != nil:
					case h2 && resp.ProtoMajor != 2:
						err = fmt.Errorf("protocol %s, want HTTP/2", resp.Proto)
					case string(b) != "ok":
						err = fmt.Errorf("body %q", b)
					}
					results <- err
				}()
			}
			tr.waitEntered(t, limit)
			waitCounts(t, semA, limit, requests-limit)
			if n := tr.inflight.Load(); n != limit {
				t.Fatalf("%d requests in flight, limit %d", n, limit)
			}
			tr.open()
			for i := 0; i < requests; i++ {
				if err := <-results; err != nil {
					t.Fatal(err)
				}
			}
			if m := tr.max.Load(); m > limit {
				t.Fatalf("%d requests in flight at once, limit %d", m, limit)
			}
			// Every body was read to EOF, which released its lease.
			wantCounts(t, semA, 0, 0)
		})
	}
}

// TestTransportReleases: the lease is released exactly once on every path.
func TestTransportReleases(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	var released atomic.Int64
	sem := newFair(t, redistest.Client(t), redistest.Name(t), 1, fair.Options{Observer: func(e redsem.Event) {
		if e.Kind == redsem.EventReleased {
			released.Add(1)
		}
	}})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/big":
			_, _ = io.WriteString(w, strings.Repeat("x", 1<<20))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			_, _ = io.WriteString(w, "small body")
		}
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &redsemhttp.Transport{Semaphore: fixed(sem)}}
	get := func(t *testing.T, method, path string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// once checks that exactly one more release happened since before.
	once := func(t *testing.T, before int64) {
		t.Helper()
		if n := released.Load() - before; n != 1 {
			t.Fatalf("%d releases, want 1", n)
		}
	}

	t.Run("body closed early", func(t *testing.T) {
		before := released.Load()
		resp := get(t, http.MethodGet, "/big")
		if _, err := resp.Body.Read(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		wantCounts(t, sem, 1, 0)
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		wantCounts(t, sem, 0, 0)
		_ = resp.Body.Close()
		once(t, before)
	})
	t.Run("body read to EOF", func(t *testing.T) {
		before := released.Load()
		resp := get(t, http.MethodGet, "/small")
		wantCounts(t, sem, 1, 0)
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "small body" {
			t.Fatalf("%q, %v", b, err)
		}
		wantCounts(t, sem, 0, 0) // before Close
		_ = resp.Body.Close()
		once(t, before)
	})
	t.Run("no body", func(t *testing.T) {
		for _, c := range []struct{ method, path string }{{http.MethodHead, "/small"}, {http.MethodGet, "/empty"}} {
			before := released.Load()
			resp := get(t, c.method, c.path)
			wantCounts(t, sem, 0, 0) // before Close
			_ = resp.Body.Close()
			once(t, before)
		}
	})
	t.Run("round trip error", func(t *testing.T) {
		down := httptest.NewServer(http.NotFoundHandler())
		down.Close()
		before := released.Load()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, down.URL, nil)
		if _, err := client.Do(req); err == nil {
			t.Fatal("request to a closed server succeeded")
		}
		wantCounts(t, sem, 0, 0)
		once(t, before)
	})
	t.Run("context ends while waiting", func(t *testing.T) {
		l, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release(ctx) }()
		before := hits.Load()
		waitCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(waitCtx, http.MethodGet, srv.URL, nil)
		_, err = client.Do(req)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "redsemhttp: acquire") {
			t.Fatalf("err %v, want a redsemhttp error matching context.DeadlineExceeded", err)
		}
		if hits.Load() != before {
			t.Fatal("request sent without a lease")
		}
		wantCounts(t, sem, 1, 0) // no queue entry left behind
	})
	t.Run("request cancelled after the response", func(t *testing.T) {
		// The release does not use the cancelled request context.
		before := released.Load()
		reqCtx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL+"/big", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = resp.Body.Close()
		wantCounts(t, sem, 0, 0)
		once(t, before)
	})
	t.Run("semaphore error", func(t *testing.T) {
		before := hits.Load()
		bad := &http.Client{Transport: &redsemhttp.Transport{Semaphore: func(*http.Request) (redsem.Semaphore, error) {
			return nil, errors.New("no limiter for host")
		}}}
		_, err := bad.Get(srv.URL)
		if err == nil || !strings.Contains(err.Error(), "redsemhttp: choose semaphore: no limiter for host") {
			t.Fatalf("err %v", err)
		}
		if hits.Load() != before {
			t.Fatal("request sent")
		}
	})
}
