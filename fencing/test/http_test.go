package fencing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// fencedServer runs Middleware(guard, handler) where the handler echoes the
// fence it was given.
func fencedServer(t *testing.T, guard fencing.Guard) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(fencing.Middleware(guard, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := fencing.FromContext(r.Context())
		if !ok {
			http.Error(w, "no fence in context", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, f.Resource)
	})))
	t.Cleanup(srv.Close)
	return srv
}

// send makes a PUT with ctx through a fencing.Transport and returns the
// status and body.
func send(t *testing.T, ctx context.Context, url string) (int, string, error) {
	t.Helper()
	client := &http.Client{Transport: &fencing.Transport{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

func TestHTTPTransportAndMiddleware(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	g := newRedisGuard(t, fencing.RedisOptions{})
	srv := fencedServer(t, g)
	r := "files/a b%{c}/ü" + redistest.Name(t) // survives the header encoding
	for i, s := range []struct {
		fence  fencing.Fence
		status int
	}{
		{fencing.Fence{Resource: r, Slot: 0, Token: 10}, http.StatusOK},
		{fencing.Fence{Resource: r, Slot: 0, Token: 10}, http.StatusOK},
		{fencing.Fence{Resource: r, Slot: 0, Token: 9}, http.StatusConflict},
		{fencing.Fence{Resource: r, Slot: 1, Token: 3}, http.StatusOK},
		{fencing.Fence{Resource: r, Slot: 0, Token: 11}, http.StatusOK},
	} {
		status, body, err := send(t, fencing.WithFence(ctx, s.fence), srv.URL)
		if err != nil || status != s.status {
			t.Fatalf("step %d %+v: %d %q %v, want %d", i, s.fence, status, body, err, s.status)
		}
		if status == http.StatusOK && body != r {
			t.Fatalf("handler saw resource %q, want %q", body, r)
		}
		if status == http.StatusConflict && !strings.Contains(body, "stale token") {
			t.Fatalf("409 body %q", body)
		}
	}
	// No fence in the context: sent unchanged; the middleware answers 400.
	if status, body, err := send(t, ctx, srv.URL); err != nil || status != http.StatusBadRequest ||
		!strings.Contains(body, fencing.HeaderResource) {
		t.Fatalf("no fence: %d %q %v, want 400 naming the header", status, body, err)
	}
	// An invalid fence in the context: nothing is sent.
	_, _, err := send(t, fencing.WithFence(ctx, fencing.Fence{Resource: r, Slot: 0, Token: 0}), srv.URL)
	if !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("invalid fence: %v, want ErrInvalidFence", err)
	}
}

func TestMiddlewareRejectsMalformedHeaders(t *testing.T) {
	called := false
	guard := fencing.GuardFunc(func(context.Context, fencing.Fence) error { called = true; return nil })
	h := fencing.Middleware(guard, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("handler called for malformed headers")
	}))
	good := map[string]string{fencing.HeaderResource: "r", fencing.HeaderSlot: "0", fencing.HeaderToken: "5"}
	for name, change := range map[string]func(http.Header){
		"no resource":    func(h http.Header) { h.Del(fencing.HeaderResource) },
		"empty resource": func(h http.Header) { h.Set(fencing.HeaderResource, "") },
		"bad escape":     func(h http.Header) { h.Set(fencing.HeaderResource, "%zz") },
		"no slot":        func(h http.Header) { h.Del(fencing.HeaderSlot) },
		"negative slot":  func(h http.Header) { h.Set(fencing.HeaderSlot, "-1") },
		"huge slot":      func(h http.Header) { h.Set(fencing.HeaderSlot, "99999999999") },
		"text slot":      func(h http.Header) { h.Set(fencing.HeaderSlot, "one") },
		"no token":       func(h http.Header) { h.Del(fencing.HeaderToken) },
		"zero token":     func(h http.Header) { h.Set(fencing.HeaderToken, "0") },
		"negative token": func(h http.Header) { h.Set(fencing.HeaderToken, "-4") },
		"float token":    func(h http.Header) { h.Set(fencing.HeaderToken, "1e5") },
		"two tokens":     func(h http.Header) { h.Add(fencing.HeaderToken, "6") },
	} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		for k, v := range good {
			req.Header.Set(k, v)
		}
		change(req.Header)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "fencing: invalid") {
			t.Fatalf("%s: %d %q, want 400", name, rec.Code, rec.Body.String())
		}
		if _, err := fencing.ParseHeaders(req.Header); !errors.Is(err, fencing.ErrInvalidFence) {
			t.Fatalf("%s: ParseHeaders: %v", name, err)
		}
	}
	if called {
		t.Fatal("guard called for malformed headers")
	}
}

func TestMiddlewareGuardFailure(t *testing.T) {
	broken := fencing.GuardFunc(func(context.Context, fencing.Fence) error { return errors.New("store down") })
	h := fencing.Middleware(broken, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("handler called although the guard failed")
	}))
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	if err := fencing.SetHeaders(req.Header, fencing.Fence{Resource: "r", Slot: 1, Token: 2}); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("%d %q, want 503", rec.Code, rec.Body.String())
	}
	if err := fencing.SetHeaders(http.Header{}, fencing.Fence{Resource: "r", Slot: -1, Token: 2}); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("SetHeaders with a bad fence: %v", err)
	}
}
