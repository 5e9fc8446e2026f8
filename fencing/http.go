package fencing

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The request headers that carry a fence. The resource is percent-encoded
// (url.PathEscape) so that any resource name fits in a header. A fence of
// one slot is sent in HeaderSlot; a weighted fence in HeaderSlots, as a
// comma-separated ascending list ("0,3,4"), and without HeaderSlot, so that
// a server that knows only HeaderSlot answers 400 instead of checking the
// first slot alone. HeaderSignature carries the fence's signature when it
// is signed (see SetSignedHeaders).
const (
	HeaderResource  = "Redsem-Fence-Resource"
	HeaderSlot      = "Redsem-Fence-Slot"
	HeaderSlots     = "Redsem-Fence-Slots"
	HeaderToken     = "Redsem-Fence-Token"
	HeaderSignature = "Redsem-Fence-Signature"
)

// SetHeaders validates f and writes it into h as the fencing headers:
// HeaderResource, HeaderToken, and HeaderSlot for one slot or HeaderSlots
// for a weighted fence (deleting the other of the two). It deletes
// HeaderSignature, which would not match the new fence. It returns an
// *InvalidFenceError and leaves h unchanged for bad input.
func SetHeaders(h http.Header, f Fence) error {
	if err := f.Validate(); err != nil {
		return err
	}
	h.Del(HeaderSignature)
	h.Set(HeaderResource, url.PathEscape(f.Resource))
	if f.weighted() {
		h.Del(HeaderSlot)
		h.Set(HeaderSlots, formatSlots(f.Slots))
	} else {
		h.Del(HeaderSlots)
		h.Set(HeaderSlot, strconv.Itoa(f.Slot))
	}
	h.Set(HeaderToken, strconv.FormatInt(f.Token, 10))
	return nil
}

// ParseHeaders reads the fence from h. The slots come from HeaderSlots or
// HeaderSlot; when both are present, HeaderSlot must be the first of
// HeaderSlots. A one-element HeaderSlots gives a fence with Slots nil. It
// returns an *InvalidFenceError (naming the header) when a header is
// missing, repeated, malformed or out of range, or the slots are not
// strictly ascending.
func ParseHeaders(h http.Header) (Fence, error) {
	get := func(name string) (string, error) {
		v := h.Values(name)
		switch len(v) {
		case 0:
			return "", &InvalidFenceError{Field: name, Reason: "missing header"}
		case 1:
			return v[0], nil
		}
		return "", &InvalidFenceError{Field: name, Value: v[0], Reason: "repeated header"}
	}
	var f Fence
	raw, err := get(HeaderResource)
	if err != nil {
		return f, err
	}
	if f.Resource, err = url.PathUnescape(raw); err != nil {
		return f, &InvalidFenceError{Field: HeaderResource, Value: raw, Reason: "bad percent-encoding"}
	}
	if len(h.Values(HeaderSlots)) > 0 {
		raw, err = get(HeaderSlots)
		if err != nil {
			return f, err
		}
		if f.Slots, err = parseSlots(raw); err != nil {
			return f, err
		}
		f.Slot = f.Slots[0]
	}
	if len(h.Values(HeaderSlot)) > 0 || f.Slots == nil {
		raw, err = get(HeaderSlot)
		if err != nil {
			return f, err
		}
		slot, err := strconv.ParseInt(raw, 10, 32)
		if err != nil {
			return f, &InvalidFenceError{Field: HeaderSlot, Value: raw, Reason: "not a 32-bit integer"}
		}
		if f.Slots != nil && int(slot) != f.Slot {
			return f, &InvalidFenceError{Field: HeaderSlot, Value: raw, Reason: "not the first of " + HeaderSlots}
		}
		f.Slot = int(slot)
	}
	if len(f.Slots) == 1 {
		f.Slots = nil // the plain one-slot fence
	}
	raw, err = get(HeaderToken)
	if err != nil {
		return f, err
	}
	if f.Token, err = strconv.ParseInt(raw, 10, 64); err != nil {
		return f, &InvalidFenceError{Field: HeaderToken, Value: raw, Reason: "not a 64-bit integer"}
	}
	return f, f.Validate()
}

// SetSignedHeaders is SetHeaders plus HeaderSignature: an HMAC-SHA256 with
// key over the fence's resource, slots and token, which a server with the
// same key verifies (ParseSignedHeaders, or Middleware with
// MiddlewareOptions.SigningKey). Use it, or Transport.SigningKey, where the
// store is reached across a trust boundary: a client without the key
// cannot present a token that no semaphore gave it. It returns an
// *InvalidFenceError for bad input or an empty key, and then leaves h
// unchanged.
//
// The value is "v1=" and the lower-case hex of
// HMAC-SHA256(key, "redsem-fence-v1\n" + slots + "\n" + token + "\n" +
// resource), where slots are the fence's slots in decimal, ascending,
// joined by commas ("3" or "0,3,4"), token is decimal, and resource is the
// resource itself (not percent-encoded), so that other languages can sign
// and check it. It covers the fence only, not the rest of the request
// (method, URL, body): use TLS against tampering on the way.
func SetSignedHeaders(h http.Header, f Fence, key []byte) error {
	if len(key) == 0 {
		return &InvalidFenceError{Field: "signing key", Reason: "empty"}
	}
	if err := SetHeaders(h, f); err != nil {
		return err
	}
	h.Set(HeaderSignature, signature(key, f))
	return nil
}

// ParseSignedHeaders is ParseHeaders for a signed fence: it also requires
// HeaderSignature to be the signature of the fence with key (see
// SetSignedHeaders), compared in constant time. A missing, repeated or
// wrong signature, or an empty key, yields an *InvalidFenceError naming
// HeaderSignature (the key: "signing key").
func ParseSignedHeaders(h http.Header, key []byte) (Fence, error) {
	if len(key) == 0 {
		return Fence{}, &InvalidFenceError{Field: "signing key", Reason: "empty"}
	}
	f, err := ParseHeaders(h)
	if err != nil {
		return f, err
	}
	v := h.Values(HeaderSignature)
	switch {
	case len(v) == 0:
		return f, &InvalidFenceError{Field: HeaderSignature, Reason: "missing header: this server accepts signed fences only"}
	case len(v) > 1:
		return f, &InvalidFenceError{Field: HeaderSignature, Value: v[0], Reason: "repeated header"}
	}
	if subtle.ConstantTimeCompare([]byte(v[0]), []byte(signature(key, f))) != 1 {
		return f, &InvalidFenceError{Field: HeaderSignature, Value: v[0],
			Reason: "does not match the fence (signed with another key, or the fence headers were changed)"}
	}
	return f, nil
}

// signature is the HeaderSignature value of f with key; see
// SetSignedHeaders.
func signature(key []byte, f Fence) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("redsem-fence-v1\n" + f.slotList() + "\n" + strconv.FormatInt(f.Token, 10) + "\n" + f.Resource))
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// parseSlots reads a HeaderSlots value: decimal slots separated by commas,
// with optional spaces around each, strictly ascending.
func parseSlots(raw string) ([]int, error) {
	parts := strings.Split(raw, ",")
	slots := make([]int, 0, len(parts))
	for _, p := range parts {
		s, err := strconv.ParseInt(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, &InvalidFenceError{Field: HeaderSlots, Value: raw, Reason: "not a list of 32-bit integers"}
		}
		if s < 0 {
			return nil, &InvalidFenceError{Field: HeaderSlots, Value: raw, Reason: "a negative slot"}
		}
		if n := len(slots); n > 0 && int(s) <= slots[n-1] {
			return nil, &InvalidFenceError{Field: HeaderSlots, Value: raw, Reason: "not strictly ascending (unsorted or a duplicate)"}
		}
		slots = append(slots, int(s))
	}
	return slots, nil
}

// Transport is an http.RoundTripper that sends the fence found in each
// request's context (see WithLease, WithFence) as the fencing headers
// (every slot of a weighted lease, see HeaderSlots), signed when
// SigningKey is set. A
// request whose context carries no fence is sent unchanged: a server behind
// Middleware answers it with 400. A fence that fails Validate makes
// RoundTrip return the *InvalidFenceError without sending anything.
type Transport struct {
	// Base sends the requests; nil: http.DefaultTransport.
	Base http.RoundTripper
	// SigningKey, when not empty, signs every fence sent
	// (SetSignedHeaders), for a server whose Middleware has the same
	// MiddlewareOptions.SigningKey; nil: fences are sent unsigned.
	SigningKey []byte
}

// RoundTrip implements http.RoundTripper. It does not modify req: it sends
// a clone with the headers set.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	f, ok := FromContext(req.Context())
	if !ok {
		return base.RoundTrip(req)
	}
	if err := f.Validate(); err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper must close the body, even on error
		}
		return nil, err
	}
	r := req.Clone(req.Context())
	if len(t.SigningKey) > 0 {
		_ = SetSignedHeaders(r.Header, f, t.SigningKey) // validated above
	} else {
		_ = SetHeaders(r.Header, f) // validated above
	}
	return base.RoundTrip(r)
}

// MiddlewareOptions configures NewMiddleware. The zero value is what
// Middleware uses.
type MiddlewareOptions struct {
	// SigningKey, when not empty, makes the middleware accept signed
	// fences only (see SetSignedHeaders; the clients send them with
	// Transport.SigningKey): a request whose HeaderSignature is missing or
	// does not match the fence is answered 400, and the guard is not asked.
	// Use a random key of at least 32 bytes, shared by the clients and the
	// servers only. nil: signatures are not checked (nor required).
	SigningKey []byte
	// MaxSkew is how far a token may be ahead of this server's clock: a
	// token above time.Now in microseconds plus MaxSkew is from the
	// future and is answered 400, and the guard is not asked. Zero:
	// DefaultMaxSkew (one minute). Negative: no bound. A RedisGuard or
	// SQLGuard behind the middleware checks again with its store's clock
	// and its own MaxSkew: the stricter of the two refuses first.
	MaxSkew time.Duration
}

// Middleware checks the fence in each request's headers with guard (for a
// weighted fence: every slot, see Guard) before calling next, and passes the fence on in the request's context (read it
// with FromContext). It answers 400 Bad Request when the headers are
// missing or malformed or the token is more than DefaultMaxSkew ahead of
// this server's clock, 409 Conflict when the token is stale, and 503
// Service Unavailable when the guard fails otherwise; in each case next is
// not called and the body is a one-line error message. It is
// NewMiddleware with the zero MiddlewareOptions: fences need not be signed.
//
// The check happens when the request arrives, so it orders requests, not
// the writes that next makes: a request admitted just before a newer holder
// of the same slot is admitted can still write after it. Where that matters,
// do the check and the write atomically in the store instead (RedisGuard.Set,
// or SQLGuard.Check in the write's transaction) and use ParseHeaders (or
// ParseSignedHeaders) in the handler.
func Middleware(guard Guard, next http.Handler) http.Handler {
	return NewMiddleware(guard, next, MiddlewareOptions{})
}

// NewMiddleware is Middleware with options: with opts.SigningKey it
// accepts signed fences only, and opts.MaxSkew bounds how far a token may
// be ahead of this server's clock. Both checks come before the guard's:
// a request that fails them is answered 400 and records nothing.
func NewMiddleware(guard Guard, next http.Handler, opts MiddlewareOptions) http.Handler {
	key := opts.SigningKey
	skew := maxSkew(opts.MaxSkew)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f Fence
		var err error
		if len(key) > 0 {
			f, err = ParseSignedHeaders(r.Header, key)
		} else {
			f, err = ParseHeaders(r.Header)
		}
		if err == nil {
			if now := time.Now().UnixMicro(); fromFuture(f.Token, now, skew) {
				err = futureError(f, now, skew, "this server's clock")
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := guard.Check(r.Context(), f); err != nil {
			switch {
			case errors.Is(err, ErrStale):
				http.Error(w, err.Error(), http.StatusConflict)
			case errors.Is(err, ErrInvalidFence):
				http.Error(w, err.Error(), http.StatusBadRequest)
			default:
				http.Error(w, "fencing: guard failed: "+err.Error(), http.StatusServiceUnavailable)
			}
			return
		}
		next.ServeHTTP(w, r.WithContext(WithFence(r.Context(), f)))
	})
}
