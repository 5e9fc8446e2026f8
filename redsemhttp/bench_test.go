package redsemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemhttp"
	"github.com/redsem/redsem/unfair"
)

// BenchmarkMiddleware: the cost of a limited request with a free slot (one
// acquire and one release against a local Redis), handler and HTTP aside.
func BenchmarkMiddleware(b *testing.B) {
	sem, err := unfair.New(redistest.Client(b), redistest.Name(b), 1000, unfair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sem.Close() })
	h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem)})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		for pb.Next() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Errorf("status %d", rec.Code)
				return
			}
		}
	})
}

// BenchmarkTransport: a request through Transport to a local test server,
// against the same request without it (the difference is the lease).
func BenchmarkTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	b.Cleanup(srv.Close)
	sem, err := unfair.New(redistest.Client(b), redistest.Name(b), 1000, unfair.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sem.Close() })
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 100
	b.Cleanup(base.CloseIdleConnections)
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"plain", base},
		{"leased", &redsemhttp.Transport{Base: base, Semaphore: fixed(sem)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: c.rt}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(srv.URL)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
		})
	}
}
