package redsemhttp_test

// Tests of promises that docs/promises.md listed as gaps: each checks one
// promise of the package's docs through Middleware, Transport or
// RoundTrip, on real semaphores of both variants.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
	"github.com/redsem/redsem/redsemhttp"
	"github.com/redsem/redsem/unfair"
)

var bothVariants = []string{"fair", "unfair"}

// semOpts are the options the tests here give either variant.
type semOpts struct {
	leaseTTL time.Duration // zero: the default
	observer redsem.Observer
}

// newVariant builds a semaphore of the variant, closed when the test ends.
func newVariant(t *testing.T, variant string, c redis.UniversalClient, name string, limit int, o semOpts) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	switch variant {
	case "fair":
		s, err = fair.New(c, name, limit, fair.Options{LeaseTTL: o.leaseTTL, Observer: o.observer})
	case "unfair":
		s, err = unfair.New(c, name, limit, unfair.Options{LeaseTTL: o.leaseTTL, Observer: o.observer})
	default:
		t.Fatalf("unknown variant %q", variant)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// events counts a semaphore's events by kind.
type events struct {
	mu sync.Mutex
	n  map[redsem.EventKind]int
}

func (e *events) observe(ev redsem.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[redsem.EventKind]int{}
	}
	e.n[ev.Kind]++
}

func (e *events) count(k redsem.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[k]
}

// loseKeys deletes every key of the semaphore name from Redis: its leases
// are lost behind their holders' backs (found at their next renewal).
func loseKeys(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := redistest.Client(t).Del(ctx, core.KeysFor(core.DefaultPrefix, name).List...).Err(); err != nil {
		t.Fatal(err)
	}
}

// cutClient is a client of the shared server through a proxy, whose
// connection to Redis the test cuts: refused (every connection reset, new
// dials refused, as when Redis is down) or black-holed (requests swallowed,
// no answer ever, as in a partition).
type cutClient struct {
	*redis.Client
	proxy  *redistest.Proxy
	refuse atomic.Bool
}

func newCutClient(t *testing.T) *cutClient {
	t.Helper()
	srv := redistest.Shared(t)
	c := &cutClient{proxy: redistest.StartProxy(t, srv.Addr)}
	opt := srv.Options()
	opt.Addr = c.proxy.Addr
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if c.refuse.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c.Client = redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Client.Close() })
	return c
}

// cut cuts the client off Redis: "refused" or "black hole".
func (c *cutClient) cut(t *testing.T, mode string) {
	t.Helper()
	switch mode {
	case "refused":
		c.refuse.Store(true)
		c.proxy.ResetAll()
	case "black hole":
		c.proxy.SetBlackhole(true)
	default:
		t.Fatalf("unknown cut %q", mode)
	}
}

// heal lets the client reach Redis again (a black hole's connections are
// reset: the client dials again).
func (c *cutClient) heal() {
	c.refuse.Store(false)
	c.proxy.SetBlackhole(false)
}

// holders returns the live holders of s (read on a client of its own).
func holders(t *testing.T, s redsem.Semaphore) int {
	t.Helper()
	h, _ := counts(t, s)
	return h
}

// An Acquire that fails otherwise than by MaxWait, the request's context,
// a full queue, the rate or an unreachable Redis (a closed semaphore, a
// limit mismatch, a Redis error) is answered 503 with Retry-After, without
// calling the handler, and FailOpen changes nothing. No MaxWait, and a
// request context that does not end: a 503 can only come from the error.
func TestMiddlewareOtherAcquireFailures(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			// serveOnce runs one request through Middleware over sem and
			// returns its answer and whether the handler ran.
			serveOnce := func(t *testing.T, sem redsem.Semaphore, failOpen bool) (*httptest.ResponseRecorder, bool) {
				t.Helper()
				var called atomic.Bool
				h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), FailOpen: failOpen, RetryAfter: 2 * time.Second})(
					http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						called.Store(true)
						_, _ = io.WriteString(w, "ran")
					}))
				reqCtx, cancel := context.WithCancel(context.Background()) // no deadline
				defer cancel()
				done := make(chan *httptest.ResponseRecorder, 1)
				go func() { done <- serve(h, reqCtx) }()
				select {
				case rec := <-done:
					return rec, called.Load()
				case <-time.After(10 * time.Second):
					cancel()
					<-done
					t.Fatal("no answer within 10s: Acquire did not fail")
					return nil, false
				}
			}
			check := func(t *testing.T, sem redsem.Semaphore) {
				t.Helper()
				for _, failOpen := range []bool{false, true} {
					rec, called := serveOnce(t, sem, failOpen)
					if called {
						t.Fatalf("FailOpen %v: the handler ran", failOpen)
					}
					if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" {
						t.Fatalf("FailOpen %v: status %d, Retry-After %q (%s); want 503 and 2",
							failOpen, rec.Code, rec.Header().Get("Retry-After"), strings.TrimSpace(rec.Body.String()))
					}
				}
			}

			t.Run("closed", func(t *testing.T) {
				sem := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 1, semOpts{})
				if err := sem.Close(); err != nil {
					t.Fatal(err)
				}
				if _, err := sem.Acquire(ctx); !errors.Is(err, redsem.ErrClosed) {
					t.Fatalf("Acquire of the closed semaphore: %v, want ErrClosed", err)
				}
				check(t, sem)
			})
			t.Run("limit mismatch", func(t *testing.T) {
				name := redistest.Name(t)
				first := newVariant(t, variant, redistest.Client(t), name, 1, semOpts{})
				l, err := first.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = l.Release(ctx) }()
				var ev events
				other := newVariant(t, variant, redistest.Client(t), name, 2, semOpts{observer: ev.observe})
				check(t, other)
				if n := ev.count(redsem.EventLimitMismatch); n != 2 {
					t.Fatalf("%d limit mismatches reported, want 2 (one per request)", n)
				}
				wantCounts(t, first, 1, 0) // nothing left behind
			})
			t.Run("Redis error", func(t *testing.T) {
				// A server out of memory (maxmemory 1 byte, noeviction):
				// every script that writes is refused with OOM.
				srv := redistest.Start(t)
				c := srv.Client(t)
				if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
					t.Fatal(err)
				}
				var ev events
				sem := newVariant(t, variant, c, redistest.Name(t), 1, semOpts{observer: ev.observe})
				if _, err := sem.TryAcquire(ctx); err == nil || !strings.Contains(err.Error(), "OOM") {
					t.Fatalf("TryAcquire on a server out of memory: %v, want its OOM error", err)
				}
				check(t, sem)
				if n := ev.count(redsem.EventAcquireFailed); n != 3 {
					t.Fatalf("%d failed acquires reported, want 3", n)
				}
			})
		})
	}
}

// Middleware panics at once without Options.Semaphore, a programming
// error, before it serves anything.
func TestMiddlewareNeedsSemaphore(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("Middleware(Options{}) did not panic")
		} else if !strings.Contains(fmtAny(r), "Semaphore") {
			t.Fatalf("panic %v does not name Options.Semaphore", r)
		}
	}()
	redsemhttp.Middleware(redsemhttp.Options{MaxWait: time.Second})
}

func fmtAny(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if err, ok := v.(error); ok {
		return err.Error()
	}
	return ""
}

// The middleware's release is detached from the request's context: a
// request whose client goes away while its handler runs (its context
// cancelled) still frees its slot when the handler returns, at once, and
// the lease ends as released.
func TestMiddlewareReleaseDetached(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			var ev events
			sem := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 1, semOpts{observer: ev.observe})
			entered := make(chan redsem.Lease, 1)
			handlerCtxErr := make(chan error, 1)
			mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem)})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					l, _ := redsemhttp.LeaseFromContext(r.Context())
					entered <- l
					select {
					case <-r.Context().Done(): // the client went away
					case <-time.After(10 * time.Second):
					}
					handlerCtxErr <- r.Context().Err()
				}))
			served := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mw.ServeHTTP(w, r)
				close(served) // the middleware returned: its release is done
			}))
			t.Cleanup(srv.Close)

			reqCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL, nil)
			clientErr := make(chan error, 1)
			go func() {
				resp, err := srv.Client().Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				clientErr <- err
			}()
			var l redsem.Lease
			select {
			case l = <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler did not run within 10s")
			}
			if l == nil {
				t.Fatal("the handler ran without a lease")
			}
			if holders(t, sem) != 1 {
				t.Fatal("no holder while the handler runs")
			}
			cancel() // the client goes away
			if err := <-handlerCtxErr; !errors.Is(err, context.Canceled) {
				t.Fatalf("the request's context: %v, want it cancelled (the client went away)", err)
			}
			select {
			case <-served:
			case <-time.After(10 * time.Second):
				t.Fatal("the middleware did not return within 10s")
			}
			// Freed by the time the middleware returned: no wait.
			if n := holders(t, sem); n != 0 {
				t.Fatalf("%d holders once the middleware returned, want 0: the release ran on the cancelled context", n)
			}
			select {
			case <-l.Done():
			default:
				t.Fatal("the lease's Done is open after the middleware returned")
			}
			if l.Err() != nil || ev.count(redsem.EventReleased) != 1 || ev.count(redsem.EventLeaseLost) != 0 {
				t.Fatalf("lease Err %v, %d released, %d lost; want nil, 1, 0", l.Err(),
					ev.count(redsem.EventReleased), ev.count(redsem.EventLeaseLost))
			}
			if err := <-clientErr; !errors.Is(err, context.Canceled) {
				t.Fatalf("the client's request: %v, want context.Canceled", err)
			}
		})
	}
}

// A lease lost while its handler runs (its keys deleted) does not stop the
// handler: its request's context goes on, it runs to its end and its
// response is sent; the release that follows reports nothing more.
func TestMiddlewareLostLeaseKeepsHandler(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			var ev events
			// Renewed every 100 ms: the loss is found soon.
			sem := newVariant(t, variant, redistest.Client(t), name, 1, semOpts{leaseTTL: 300 * time.Millisecond, observer: ev.observe})
			entered := make(chan redsem.Lease, 1)
			proceed := make(chan struct{})
			type afterLoss struct {
				leaseErr, reqErr error
				lostSeen         bool
			}
			seen := make(chan afterLoss, 1)
			mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem)})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					l, ok := redsemhttp.LeaseFromContext(r.Context())
					if !ok {
						http.Error(w, "no lease", http.StatusInternalServerError)
						return
					}
					entered <- l
					<-proceed
					var a afterLoss
					select {
					case <-l.Done():
						a.lostSeen = true
					case <-time.After(10 * time.Second):
					}
					a.leaseErr, a.reqErr = l.Err(), r.Context().Err()
					seen <- a
					_, _ = io.WriteString(w, "finished after the loss")
				}))
			srv := httptest.NewServer(mw)
			t.Cleanup(srv.Close)
			type answer struct {
				code int
				body string
				err  error
			}
			answers := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := srv.Client().Do(req)
				if err != nil {
					answers <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				answers <- answer{code: resp.StatusCode, body: string(b), err: err}
			}()
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler did not run within 10s")
			}
			loseKeys(t, ctx, name)
			close(proceed)
			a := <-seen
			if !a.lostSeen || !errors.Is(a.leaseErr, redsem.ErrLeaseLost) {
				t.Fatalf("lease not found lost within 10s (Err %v)", a.leaseErr)
			}
			if a.reqErr != nil {
				t.Fatalf("the request's context ended with the lease: %v", a.reqErr)
			}
			ans := <-answers
			if ans.err != nil || ans.code != http.StatusOK || ans.body != "finished after the loss" {
				t.Fatalf("response: %d %q, %v; want the handler's 200", ans.code, ans.body, ans.err)
			}
			// The event is reported once the lease's lock is let go, just
			// after Done closed: the handler may have answered first.
			redistest.WaitFor(t, 5*time.Second, "the loss reported", func() (bool, error) {
				return ev.count(redsem.EventLeaseLost) >= 1, nil
			})
			if l, r := ev.count(redsem.EventLeaseLost), ev.count(redsem.EventReleased); l != 1 || r != 0 {
				t.Fatalf("%d lost, %d released; want 1, 0", l, r)
			}
			if n := holders(t, sem); n != 0 {
				t.Fatalf("%d holders, want 0", n)
			}
		})
	}
}

// A release that fails stops the lease's renewals, and its slot comes back
// by the lease's TTL at the latest. The response is sent within
// ReleaseTimeout of the handler's return either way.
//
//   - refused, black hole: Redis cannot be reached (every connection
//     reset and new dials refused; or nothing answered) while the
//     middleware releases, and is reachable again at once after: the slot
//     is free by LeaseTTL (the release is retried in the background, or
//     the lease expires).
//   - release held: only the release requests are held back (a minute, in
//     the proxy), the renewals would go through: the slot is free by
//     LeaseTTL only if no renewal was sent after the failed release.
func TestMiddlewareFailedRelease(t *testing.T) {
	const ttl, releaseTimeout = 2 * time.Second, 500 * time.Millisecond
	for _, variant := range bothVariants {
		for _, mode := range []string{"refused", "black hole", "release held"} {
			t.Run(variant+"/"+mode, func(t *testing.T) {
				ctx := redistest.Ctx(t, 30*time.Second)
				name := redistest.Name(t)
				cc := newCutClient(t)
				var ev events
				sem := newVariant(t, variant, cc.Client, name, 1, semOpts{leaseTTL: ttl, observer: ev.observe})
				watch := newVariant(t, variant, redistest.Client(t), name, 1, semOpts{leaseTTL: ttl}) // reads Status past the cut
				entered := make(chan struct{})
				proceed := make(chan struct{})
				h := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem), ReleaseTimeout: releaseTimeout})(
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						close(entered)
						<-proceed
						_, _ = io.WriteString(w, "done")
					}))
				done := make(chan *httptest.ResponseRecorder, 1)
				go func() { done <- serve(h, ctx) }()
				select {
				case <-entered:
				case <-time.After(10 * time.Second):
					t.Fatal("the handler did not run within 10s")
				}
				if holders(t, watch) != 1 {
					t.Fatal("no holder while the handler runs")
				}
				if mode == "release held" {
					cc.proxy.SetDelay(time.Minute, releaseMarker(t, sem))
				} else {
					cc.cut(t, mode)
				}
				cutAt := time.Now()
				close(proceed)
				rec := <-done
				took := time.Since(cutAt)
				if rec.Code != http.StatusOK || rec.Body.String() != "done" {
					t.Fatalf("response %d %q, want the handler's", rec.Code, rec.Body)
				}
				if took > releaseTimeout+time.Second {
					t.Fatalf("the response came %v after the handler returned; ReleaseTimeout is %v", took, releaseTimeout)
				}
				if n := ev.count(redsem.EventReleased); n != 0 {
					t.Fatalf("%d releases reported while the release could not reach Redis", n)
				}
				if holders(t, watch) != 1 {
					t.Fatal("the slot was freed although no release reached Redis")
				}
				if mode != "release held" {
					cc.heal()
				}
				// The lease's deadline in Redis is at most ttl after cutAt
				// (after the last renewal before it), unless a renewal
				// moved it later.
				deadline := cutAt.Add(ttl + time.Second)
				for holders(t, watch) != 0 {
					if time.Now().After(deadline) {
						t.Fatalf("the slot is still held %v after the failed release (LeaseTTL %v): the lease was renewed after it",
							time.Since(cutAt).Round(time.Millisecond), ttl)
					}
					time.Sleep(10 * time.Millisecond)
				}
				t.Logf("slot back %v after the cut", time.Since(cutAt).Round(time.Millisecond))
			})
		}
	}
}

// releaseMarker returns the bytes by which a proxy recognises sem's
// release requests: the function's name once its engine runs the scripts
// as functions, else the script's SHA1 (it waits until the engine knows).
func releaseMarker(t *testing.T, sem redsem.Semaphore) []byte {
	t.Helper()
	e := core.EngineOf(sem)
	if e == nil {
		t.Fatalf("no engine behind %T", sem)
	}
	redistest.WaitFor(t, 5*time.Second, "the script mode settled", func() (bool, error) {
		return e.ScriptMode() != "pending", nil
	})
	if e.ScriptMode() == "fcall" {
		return []byte(lua.Release.Function())
	}
	return []byte(lua.Release.Hash())
}

// A body read that fails (the server closes the connection mid-body)
// releases the Transport's lease in that Read, before Close; Close then
// releases nothing more.
func TestTransportFailedBodyRead(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			var ev events
			sem := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 1, semOpts{observer: ev.observe})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "partial")
				rc := http.NewResponseController(w)
				_ = rc.Flush()
				if conn, _, err := rc.Hijack(); err == nil {
					_ = conn.Close() // 993 bytes short
				}
			}))
			t.Cleanup(srv.Close)
			base := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(base.CloseIdleConnections)
			client := &http.Client{Transport: &redsemhttp.Transport{Base: base, Semaphore: fixed(sem)}}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if holders(t, sem) != 1 {
				t.Fatal("no holder while the body is unread")
			}
			b, err := io.ReadAll(resp.Body)
			if err == nil || string(b) != "partial" {
				t.Fatalf("read %q, %v; want the partial body and an error", b, err)
			}
			// Released in the failed Read: no wait, no Close.
			if n := holders(t, sem); n != 0 {
				t.Fatalf("%d holders after the failed read, before Close; want 0", n)
			}
			if n := ev.count(redsem.EventReleased); n != 1 {
				t.Fatalf("%d releases after the failed read, want 1", n)
			}
			_ = resp.Body.Close()
			if n := ev.count(redsem.EventReleased); n != 1 {
				t.Fatalf("%d releases after Close, want 1", n)
			}
		})
	}
}

// closeRecorder is a request body that counts its Close calls.
type closeRecorder struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeRecorder) Close() error { c.closed.Add(1); return nil }

// RoundTrip that gets no lease closes the request body and sends nothing:
// the context ended while every slot was held, Redis failed (refused), the
// Semaphore func failed or returned none, no Semaphore func.
func TestRoundTripClosesBodyWithoutLease(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(srv.Close)
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	// roundTrip calls RoundTrip itself (http.Client closes bodies on its
	// own) with a recorded body, and checks that it was closed once and
	// nothing was sent; it returns RoundTrip's error.
	roundTrip := func(t *testing.T, tr *redsemhttp.Transport, ctx context.Context) error {
		t.Helper()
		body := &closeRecorder{Reader: strings.NewReader("payload")}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		before := hits.Load()
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
			t.Fatal("RoundTrip without a lease succeeded")
		}
		if !strings.HasPrefix(err.Error(), "redsemhttp: ") {
			t.Errorf("error %q lacks the prefix \"redsemhttp: \"", err)
		}
		if n := body.closed.Load(); n != 1 {
			t.Errorf("request body closed %d times, want 1", n)
		}
		if hits.Load() != before {
			t.Error("the request was sent without a lease")
		}
		return err
	}
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			t.Run("context ends while every slot is held", func(t *testing.T) {
				sem := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 1, semOpts{})
				l, err := sem.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = l.Release(ctx) }()
				wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				err = roundTrip(t, &redsemhttp.Transport{Base: base, Semaphore: fixed(sem)}, wctx)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("error %v, want one matching context.DeadlineExceeded", err)
				}
				wantCounts(t, sem, 1, 0)
			})
			t.Run("Redis refused", func(t *testing.T) {
				port, err := redistest.FreePort()
				if err != nil {
					t.Fatal(err)
				}
				dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1,
					DialTimeout: time.Second, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = dead.Close() })
				sem := newVariant(t, variant, dead, redistest.Name(t), 1, semOpts{})
				wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				err = roundTrip(t, &redsemhttp.Transport{Base: base, Semaphore: fixed(sem)}, wctx)
				if !errors.Is(err, redsem.ErrUnavailable) {
					t.Fatalf("error %v, want one matching redsem.ErrUnavailable", err)
				}
			})
		})
	}
	t.Run("Semaphore fails", func(t *testing.T) {
		pickErr := errors.New("no limiter for host")
		err := roundTrip(t, &redsemhttp.Transport{Base: base, Semaphore: func(*http.Request) (redsem.Semaphore, error) {
			return nil, pickErr
		}}, context.Background())
		if !errors.Is(err, pickErr) {
			t.Fatalf("error %v, want one wrapping the Semaphore func's", err)
		}
	})
	t.Run("Semaphore returns none", func(t *testing.T) {
		roundTrip(t, &redsemhttp.Transport{Base: base, Semaphore: func(*http.Request) (redsem.Semaphore, error) {
			return nil, nil
		}}, context.Background())
	})
	t.Run("no Semaphore", func(t *testing.T) {
		roundTrip(t, &redsemhttp.Transport{Base: base}, context.Background())
	})
}

// A lease lost while its request is in flight (its keys deleted while the
// server holds the response) does not cancel the request: the server's
// request context goes on, the response arrives intact, and the body's
// Close returns no error (the release reports nothing more).
func TestTransportLostLeaseKeepsRequest(t *testing.T) {
	const payload = "the whole response, intact"
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			var ev events
			sem := newVariant(t, variant, redistest.Client(t), name, 1, semOpts{leaseTTL: 300 * time.Millisecond, observer: ev.observe})
			arrived := make(chan struct{})
			gate := make(chan struct{})
			serverCtxErr := make(chan error, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				select {
				case <-gate:
				case <-r.Context().Done():
				case <-time.After(15 * time.Second):
				}
				serverCtxErr <- r.Context().Err()
				_, _ = io.WriteString(w, payload)
			}))
			t.Cleanup(srv.Close)
			base := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(base.CloseIdleConnections)
			client := &http.Client{Transport: &redsemhttp.Transport{Base: base, Semaphore: fixed(sem)}}
			type result struct {
				resp *http.Response
				err  error
			}
			results := make(chan result, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				results <- result{resp, err}
			}()
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the request did not arrive within 10s")
			}
			loseKeys(t, ctx, name)
			redistest.WaitFor(t, 10*time.Second, "the lease found lost", func() (bool, error) {
				return ev.count(redsem.EventLeaseLost) == 1, nil
			})
			close(gate)
			if err := <-serverCtxErr; err != nil {
				t.Fatalf("the server's request context ended: %v", err)
			}
			r := <-results
			if r.err != nil {
				t.Fatalf("request: %v", r.err)
			}
			b, err := io.ReadAll(r.resp.Body)
			if err != nil || r.resp.StatusCode != http.StatusOK || string(b) != payload {
				t.Fatalf("response %d %q, %v; want 200 %q", r.resp.StatusCode, b, err, payload)
			}
			if err := r.resp.Body.Close(); err != nil {
				t.Fatalf("Close of the body: %v, want nil", err)
			}
			if l, rel := ev.count(redsem.EventLeaseLost), ev.count(redsem.EventReleased); l != 1 || rel != 0 {
				t.Fatalf("%d lost, %d released; want 1, 0", l, rel)
			}
			if n := holders(t, sem); n != 0 {
				t.Fatalf("%d holders, want 0", n)
			}
		})
	}
}
