package wire

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/lua"
)

// The FUNCTION library (lua.Library) as a client's script calls see it:
// whether they use FCALL (Library.Ready) or EVALSHA, and the load itself
// (Load). When to load, and what to log of it, is the engine's
// (functions.go): this file only keeps the state and sends the request.

// What a client's script calls use (Library.Mode).
const (
	LibUnknown uint32 = iota // not tried yet (or to be tried again): EVALSHA
	LibLoading               // a load is in flight: EVALSHA
	LibReady                 // FCALL
	LibRefused               // the server refused FUNCTION: EVALSHA for good
)

// Library is the library state of one client, shared by its engines.
type Library struct {
	mode   atomic.Uint32
	mu     sync.Mutex
	failed time.Time // when the last load failed (not refused); under mu
}

// libsByClient holds the state of each client that can load the library,
// by a weak pointer to it: a client that is collected takes its entry with
// it, and a new client at the same address is another key.
var libsByClient sync.Map // weak.Pointer[redis.Client or redis.ClusterClient] -> *Library

// LibraryFor returns the library state of client c (a fresh one, never
// shared, for a client that cannot load it: those stay on EVALSHA).
func LibraryFor(c redis.UniversalClient) *Library {
	switch c := c.(type) {
	case *redis.Client:
		return libOf(c)
	case *redis.ClusterClient:
		return libOf(c)
	}
	return &Library{}
}

func libOf[T any](c *T) *Library {
	key := weak.Make(c)
	if l, ok := libsByClient.Load(key); ok {
		return l.(*Library)
	}
	l, loaded := libsByClient.LoadOrStore(key, &Library{})
	if !loaded {
		runtime.AddCleanup(c, func(k weak.Pointer[T]) { libsByClient.Delete(k) }, key)
	}
	return l.(*Library)
}

// Ready reports whether calls use FCALL.
func (l *Library) Ready() bool { return l.mode.Load() == LibReady }

// Mode is what calls use now (LibUnknown, LibLoading, LibReady or
// LibRefused).
func (l *Library) Mode() uint32 { return l.mode.Load() }

// Start reports whether a load is due (none in flight, none done, not
// refused, and the last failure bounds.LibRetry ago or more), and if so
// marks one in flight: the caller then runs Load and reports it to Done.
func (l *Library) Start() bool {
	if l.mode.Load() != LibUnknown {
		return false
	}
	l.mu.Lock()
	wait := !l.failed.IsZero() && time.Since(l.failed) < bounds.LibRetry
	l.mu.Unlock()
	return !wait && l.mode.CompareAndSwap(LibUnknown, LibLoading)
}

// Done records how a load that Start began ended: loaded (err nil),
// refused for good (Refused), or failed now (tried again after
// bounds.LibRetry).
func (l *Library) Done(err error) {
	switch {
	case err == nil:
		l.mode.Store(LibReady)
	case Refused(err):
		l.mode.Store(LibRefused)
	default:
		l.mu.Lock()
		l.failed = time.Now()
		l.mu.Unlock()
		l.mode.Store(LibUnknown)
	}
}

// ForgetFailure lets the next Start begin a load at once, whenever the
// last one failed (for tests).
func (l *Library) ForgetFailure() {
	l.mu.Lock()
	l.failed = time.Time{}
	l.mu.Unlock()
}

// Load loads the library on the client's server (on every master of a
// cluster). A library of that name that exists already is the same text:
// its name is its hash.
func Load(ctx context.Context, c redis.UniversalClient) error {
	_, src := lua.Library()
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, src).Err()
		if LibraryExists(err) {
			return nil
		}
		return err
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Client:
		return load(ctx, c)
	}
	return fmt.Errorf("redsem: FUNCTION LOAD: unsupported client %T", c)
}
