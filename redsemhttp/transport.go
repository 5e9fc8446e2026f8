package redsemhttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/detach"
)

// Transport is an http.RoundTripper that holds a lease for each outbound
// request, from before it is sent until its response body is closed (or
// the round trip fails), so at most the limit's requests are in flight
// across every process.
//
// The lease is released exactly once, at the first of: the response body
// closed, the body read to its end (io.EOF) or failing a read, the round
// trip returning an error. A response without a body (http.NoBody, a HEAD
// request, 204 No Content, 304 Not Modified) releases its lease before
// RoundTrip returns. A body that is never closed nor read to the end holds
// its slot for as long as the process runs, because the lease renews
// itself: close every body (defer resp.Body.Close()), as net/http requires
// anyway to reuse connections.
//
// A lease lost while its request is in flight does not cancel the request.
// It works with HTTP/1 and HTTP/2 alike: the lease is per request, not per
// connection. A Transport is safe for concurrent use; its fields must not
// change once it is in use.
type Transport struct {
	// Base sends the requests; nil: http.DefaultTransport.
	Base http.RoundTripper
	// Semaphore picks the semaphore for a request (one per host, per API
	// key, ...). It is required; an error fails the round trip without
	// sending anything.
	Semaphore func(*http.Request) (redsem.Semaphore, error)
	// ReleaseTimeout bounds each Release, which runs detached from the
	// request's context (it frees the slot even after a cancellation);
	// zero: 5s.
	ReleaseTimeout time.Duration
}

// RoundTrip implements http.RoundTripper. It waits for a lease within the
// request's context; if none is granted (the context ended, Redis failed,
// Semaphore returned an error) it returns an error prefixed "redsemhttp: "
// that wraps the cause (errors.Is(err, context.DeadlineExceeded) after a
// timeout), closes the request body and sends nothing. Otherwise it returns
// Base's response and error unchanged, except that the response body
// releases the lease as described on Transport.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on error
		}
	}
	if t.Semaphore == nil {
		closeBody()
		return nil, errors.New("redsemhttp: Transport.Semaphore is nil")
	}
	sem, err := t.Semaphore(req)
	if err == nil && sem == nil {
		err = errNoSemaphore
	}
	if err != nil {
		closeBody()
		return nil, fmt.Errorf("redsemhttp: choose semaphore: %w", err)
	}
	lease, err := sem.Acquire(req.Context())
	if err != nil {
		closeBody()
		return nil, fmt.Errorf("redsemhttp: acquire %q: %w", sem.Name(), err)
	}
	timeout := t.ReleaseTimeout
	if timeout <= 0 {
		timeout = bounds.Release
	}
	ctx := req.Context()
	var once sync.Once
	release := func() {
		once.Do(func() {
			_ = detach.Release(ctx, lease, timeout) // on failure the slot comes back after its TTL
		})
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	if err != nil || resp == nil {
		release()
		return resp, err
	}
	if resp.Body == nil || resp.Body == http.NoBody || req.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		release()
		return resp, nil
	}
	b := &body{rc: resp.Body, release: release}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
		// 101 Switching Protocols: the body is the connection, writable.
		resp.Body = &writableBody{body: b, w: rwc}
	} else {
		resp.Body = b
	}
	return resp, nil
}

// body releases the lease at its end, on a read error, or on Close.
type body struct {
	rc      io.ReadCloser
	release func()
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *body) Close() error {
	err := b.rc.Close()
	b.release()
	return err
}

// writableBody keeps an upgraded connection's body writable.
type writableBody struct {
	*body
	w io.Writer
}

func (b *writableBody) Write(p []byte) (int, error) { return b.w.Write(p) }
