package fencing_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// forgedToken is a token from the future: 2^53-1 microseconds since 1970 is
// in the year 2255. Recorded once, it would make every real token of its
// slots stale until then.
const forgedToken = 9007199254740991

// httpErr turns a response of Middleware into a guard's result: nil for
// 200, ErrStale for 409, ErrInvalidFence for 400.
func httpErr(status int, body string) error {
	switch status {
	case http.StatusOK:
		return nil
	case http.StatusConflict:
		return fmt.Errorf("%w: 409 %s", fencing.ErrStale, body)
	case http.StatusBadRequest:
		return fmt.Errorf("%w: 400 %s", fencing.ErrInvalidFence, body)
	}
	return fmt.Errorf("status %d: %s", status, body)
}

// httpGuardStore is a service behind NewMiddleware(guard, opts) and a
// client that sends through tr. With a nil guard, the guard records in
// memory, with no clock of its own: only the middleware's checks stand
// between a forged token and the record.
func httpGuardStore(t *testing.T, guard fencing.Guard, opts fencing.MiddlewareOptions, tr http.RoundTripper) store {
	var mu sync.Mutex
	rec := map[string]int64{} // resource/slot -> highest
	key := func(r string, slot int) string { return fmt.Sprintf("%s/%d", r, slot) }
	memory := fencing.GuardFunc(func(_ context.Context, f fencing.Fence) error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range f.AllSlots() {
			if rec[key(f.Resource, s)] > f.Token {
				return &fencing.StaleError{Fence: f, Slot: s, Highest: rec[key(f.Resource, s)]}
			}
		}
		for _, s := range f.AllSlots() {
			rec[key(f.Resource, s)] = f.Token
		}
		return nil
	})
	if guard == nil {
		guard = memory
	}
	srv := httptest.NewServer(fencing.NewMiddleware(guard, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), opts))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: tr}
	return store{
		check: func(ctx context.Context, f fencing.Fence) error {
			req, err := http.NewRequestWithContext(fencing.WithFence(ctx, f), http.MethodPut, srv.URL, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return httpErr(resp.StatusCode, strings.TrimSpace(string(b)))
		},
		highest: func(_ context.Context, r string, slot int) int64 {
			mu.Lock()
			defer mu.Unlock()
			return rec[key(r, slot)]
		},
	}
}

// forgeStores are the guards a forged token is presented to, each made
// with a MaxSkew option: each guard type directly, the guarded write, and
// HTTP.
var forgeStores = []struct {
	name string
	mk   func(*testing.T, time.Duration) store
}{
	{"redis", redisGuardStoreSkew},
	{"redis-set", func(t *testing.T, skew time.Duration) store {
		g := newRedisGuard(t, fencing.RedisOptions{MaxSkew: skew})
		c := redistest.Client(t)
		return store{
			check: func(ctx context.Context, f fencing.Fence) error {
				key := g.DataKey(f.Resource, "v")
				before := c.Get(ctx, key).Val()
				err := g.Set(ctx, f, key, fmt.Sprint(f.Token), 0)
				if after := c.Get(ctx, key).Val(); err != nil && after != before {
					t.Errorf("refused Set (%v) changed the data key from %q to %q", err, before, after)
				}
				return err
			},
			highest: func(ctx context.Context, r string, slot int) int64 {
				n, err := g.Highest(ctx, r, slot)
				if err != nil {
					t.Error(err)
				}
				return n
			},
		}
	}},
	{"sql", sqlGuardStoreSkew},
	{"http-memory", func(t *testing.T, skew time.Duration) store {
		return httpGuardStore(t, nil, fencing.MiddlewareOptions{MaxSkew: skew}, &fencing.Transport{})
	}},
}

// TestForgedTokenRefused: a token from the future (a bug, or a hostile
// client) is refused by every guard as invalid, records nothing, and the
// legitimate holders of its slots, before and after it, are not disturbed.
// Before guards checked the clock, the forged token was recorded and every
// later holder of its slots was refused as stale.
func TestForgedTokenRefused(t *testing.T) {
	for _, fs := range forgeStores {
		t.Run(fs.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 10*time.Second)
			s := fs.mk(t, 0)
			r := redistest.Name(t)
			sem, err := unfair.New(redistest.Client(t), redistest.Name(t), 2, unfair.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer sem.Close()
			a, err := sem.AcquireN(ctx, 2) // slots 0 and 1: the whole limit
			if err != nil {
				t.Fatal(err)
			}
			if err := s.check(ctx, fencing.Of(r, a)); err != nil {
				t.Fatalf("legitimate holder a: %v", err)
			}
			want := func(what string, tok int64) {
				t.Helper()
				for _, slot := range []int{0, 1} {
					if got := s.highest(ctx, r, slot); got != tok {
						t.Fatalf("%s: slot %d records %d, want %d", what, slot, got, tok)
					}
				}
			}
			for _, f := range []fencing.Fence{
				{Resource: r, Slot: 0, Token: forgedToken},
				{Resource: r, Slot: 0, Slots: []int{0, 1}, Token: forgedToken},
				{Resource: r, Slot: 1, Token: a.Token() + (30 * time.Minute).Microseconds()},
			} {
				err := s.check(ctx, f)
				if !errors.Is(err, fencing.ErrInvalidFence) {
					t.Fatalf("forged %+v: %v, want refused as invalid", f, err)
				}
				var ie *fencing.InvalidFenceError
				if fs.name != "http-memory" && (!errors.As(err, &ie) || ie.Field != "token") {
					t.Fatalf("forged %+v: %v, want an *InvalidFenceError for the token", f, err)
				}
				want(fmt.Sprintf("after forged %+v", f), a.Token())
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b, err := sem.AcquireN(ctx, 2) // a's slots, a higher token
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release(ctx)
			if err := s.check(ctx, fencing.Of(r, b)); err != nil {
				t.Fatalf("legitimate holder b after the forged tokens: %v", err)
			}
			want("after b", b.Token())
			if err := s.check(ctx, fencing.Of(r, a)); !errors.Is(err, fencing.ErrStale) {
				t.Fatalf("a after b: %v, want stale", err)
			}
		})
	}
}

// TestMaxSkew: the bound is each guard's MaxSkew option, against its own
// store's clock; zero is DefaultMaxSkew, negative turns it off.
func TestMaxSkew(t *testing.T) {
	for _, fs := range forgeStores {
		t.Run(fs.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 10*time.Second)
			r := redistest.Name(t)
			ahead := func(d time.Duration) int64 { return time.Now().Add(d).UnixMicro() }
			for i, c := range []struct {
				skew  time.Duration
				token int64
				ok    bool
			}{
				{0, ahead(-time.Second), true},
				{0, ahead(fencing.DefaultMaxSkew / 2), true},
				{0, ahead(2 * fencing.DefaultMaxSkew), false},
				{time.Hour, ahead(30 * time.Minute), true},
				{time.Hour, ahead(2 * time.Hour), false},
				{time.Second, ahead(30 * time.Second), false},
				{-1, forgedToken, true},
				{-1, math.MaxInt64, true},
			} {
				s := fs.mk(t, c.skew)
				f := fencing.Fence{Resource: fmt.Sprintf("%s-%d", r, i), Slot: 0, Token: c.token}
				err := s.check(ctx, f)
				if c.ok != (err == nil) || (err != nil && !errors.Is(err, fencing.ErrInvalidFence)) {
					t.Fatalf("MaxSkew %v, token %v ahead: %v, want accepted %v",
						c.skew, time.Duration(c.token-time.Now().UnixMicro())*time.Microsecond, err, c.ok)
				}
				want := int64(0)
				if c.ok {
					want = c.token
				}
				if got := s.highest(ctx, f.Resource, 0); got != want {
					t.Fatalf("MaxSkew %v: records %d, want %d", c.skew, got, want)
				}
			}
		})
	}
}

// tamper is a RoundTripper that changes the headers a Transport set, then
// sends the request.
type tamper func(http.Header)

func (fn tamper) RoundTrip(r *http.Request) (*http.Response, error) {
	fn(r.Header)
	return http.DefaultTransport.RoundTrip(r)
}

// TestSignedFence: with a signing key, Middleware accepts the fences that
// a Transport with the same key sent, and refuses (400, the guard not
// asked, nothing recorded) a missing, wrong or repeated signature and a
// signed fence whose headers were changed on the way.
func TestSignedFence(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	key := []byte("0123456789abcdef0123456789abcdef")
	g := newRedisGuard(t, fencing.RedisOptions{})
	r := redistest.Name(t)
	signed := func(tr http.RoundTripper) store {
		return httpGuardStore(t, g, fencing.MiddlewareOptions{SigningKey: key}, tr)
	}
	good := signed(&fencing.Transport{SigningKey: key})
	now := time.Now().UnixMicro()
	legit := fencing.Fence{Resource: r, Slot: 0, Slots: []int{0, 1}, Token: now}
	if err := good.check(ctx, legit); err != nil {
		t.Fatalf("signed fence: %v", err)
	}
	next := legit
	next.Token = now + 1000 // a later holder, in the past still
	for name, c := range map[string]struct {
		tr   http.RoundTripper
		want string
	}{
		"unsigned":  {&fencing.Transport{}, "missing header"},
		"other key": {&fencing.Transport{SigningKey: []byte("another key, 32 bytes long......")}, "does not match"},
		"token raised": {&fencing.Transport{SigningKey: key, Base: tamper(func(h http.Header) {
			h.Set(fencing.HeaderToken, fmt.Sprint(now+2000))
		})}, "does not match"},
		"slot dropped": {&fencing.Transport{SigningKey: key, Base: tamper(func(h http.Header) {
			h.Set(fencing.HeaderSlots, "0")
		})}, "does not match"},
		"resource changed": {&fencing.Transport{SigningKey: key, Base: tamper(func(h http.Header) {
			h.Set(fencing.HeaderResource, r+"x")
		})}, "does not match"},
		"signature garbled": {&fencing.Transport{SigningKey: key, Base: tamper(func(h http.Header) {
			h.Set(fencing.HeaderSignature, strings.ToUpper(h.Get(fencing.HeaderSignature)))
		})}, "does not match"},
		"signature repeated": {&fencing.Transport{SigningKey: key, Base: tamper(func(h http.Header) {
			h.Add(fencing.HeaderSignature, h.Get(fencing.HeaderSignature))
		})}, "repeated header"},
	} {
		err := signed(c.tr).check(ctx, next)
		if !errors.Is(err, fencing.ErrInvalidFence) || !strings.Contains(err.Error(), fencing.HeaderSignature) ||
			!strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want 400 naming %s: %s", name, err, fencing.HeaderSignature, c.want)
		}
		for _, res := range []string{r, r + "x"} {
			for _, slot := range []int{0, 1} {
				want := int64(0)
				if res == r {
					want = now
				}
				if got, err := g.Highest(ctx, res, slot); err != nil || got != want {
					t.Fatalf("%s: %s slot %d records %d, %v; want %d", name, res, slot, got, err, want)
				}
			}
		}
	}
	// The key does not let a token run ahead of the clock.
	if err := good.check(ctx, fencing.Fence{Resource: r, Slot: 0, Token: forgedToken}); !errors.Is(err, fencing.ErrInvalidFence) ||
		!strings.Contains(err.Error(), "from the future") {
		t.Fatalf("signed forged token: %v, want 400 from the future", err)
	}
	if err := good.check(ctx, next); err != nil {
		t.Fatalf("signed later holder: %v", err)
	}
	// A server without a key ignores the signature.
	if err := httpGuardStore(t, g, fencing.MiddlewareOptions{}, &fencing.Transport{SigningKey: key}).check(ctx, next); err != nil {
		t.Fatalf("signed fence, server without a key: %v", err)
	}
}

// TestSignatureFormat pins the documented signature, so that clients in
// other languages can compute it, and checks SetSignedHeaders and
// ParseSignedHeaders by hand.
func TestSignatureFormat(t *testing.T) {
	key := []byte("k")
	for _, c := range []struct {
		f     fencing.Fence
		slots string
	}{
		{fencing.Fence{Resource: "files/a b\nü", Slot: 3, Token: 1796290378711854}, "3"},
		{fencing.Fence{Resource: "r", Slot: 0, Slots: []int{0, 3, 4}, Token: 7}, "0,3,4"},
	} {
		f := c.f
		h := http.Header{}
		h.Set(fencing.HeaderSignature, "stale")
		if err := fencing.SetHeaders(h, f); err != nil || h.Get(fencing.HeaderSignature) != "" {
			t.Fatalf("SetHeaders kept a signature: %v %v", h, err)
		}
		if err := fencing.SetSignedHeaders(h, f, key); err != nil {
			t.Fatal(err)
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte("redsem-fence-v1\n" + c.slots + "\n" + fmt.Sprint(f.Token) + "\n" + f.Resource))
		if want := "v1=" + hex.EncodeToString(m.Sum(nil)); h.Get(fencing.HeaderSignature) != want {
			t.Fatalf("%+v: signature %q, want %q", f, h.Get(fencing.HeaderSignature), want)
		}
		back, err := fencing.ParseSignedHeaders(h, key)
		if err != nil || back.Resource != f.Resource || back.Token != f.Token || back.Slot != f.Slot {
			t.Fatalf("ParseSignedHeaders: %+v, %v", back, err)
		}
		if _, err := fencing.ParseSignedHeaders(h, []byte("K")); !errors.Is(err, fencing.ErrInvalidFence) {
			t.Fatalf("ParseSignedHeaders with another key: %v", err)
		}
	}
	if err := fencing.SetSignedHeaders(http.Header{}, fencing.Fence{Resource: "r", Token: 1}, nil); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("SetSignedHeaders without a key: %v", err)
	}
	if _, err := fencing.ParseSignedHeaders(http.Header{}, nil); !errors.Is(err, fencing.ErrInvalidFence) {
		t.Fatalf("ParseSignedHeaders without a key: %v", err)
	}
}
