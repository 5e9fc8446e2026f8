package core

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/lua"
)

// The semaphore scripts run as functions of a Redis 7 FUNCTION library
// (lua.Library) where the server allows it: Redis then compiles the Lua library
// once per load, not on every call, which saves the library chunk's cost
// (about a fifth of a script call). Each client decides once:
//
//   - Its engines' calls start with EVALSHA (a script's first call on an
//     engine sends it whole, as before), so a fresh process's first call
//     costs no more round trips than it did.
//   - After its first successful script call, the client loads the library
//     in the background (FUNCTION LOAD; on a cluster, on every master), on
//     no caller's path. Once loaded, calls use FCALL (FCALL_RO for
//     status.lua).
//   - A server that refuses FUNCTION (Redis 6.2, miniredis, an ACL, a
//     managed service) keeps EVALSHA for the client's life; that is logged
//     once at Debug (an expected mode, not a fault). A load that fails otherwise (Redis unreachable, or in a
//     passing state: MISCONF after a failed save, OOM, LOADING, READONLY;
//     see refused) is tried again bounds.LibRetry later.
//   - An FCALL answered "Function not found" (a restart without
//     persistence, a failover to a server that never saw the library, a
//     new master) is run again at once with EVALSHA, so the caller sees no
//     error, and the library is loaded again in the background.

// What a client's script calls use (libState.mode).
const (
	libUnknown uint32 = iota // not tried yet (or to be tried again): EVALSHA
	libLoading               // a load is in flight: EVALSHA
	libReady                 // FCALL
	libRefused               // the server refused FUNCTION: EVALSHA for good
)

type libState struct {
	mode   atomic.Uint32
	mu     sync.Mutex
	failed time.Time // when the last load failed (not refused); under mu
}

// libsByClient holds the state of each client that can load the library,
// by a weak pointer to it: a client that is collected takes its entry with
// it, and a new client at the same address is another key.
var libsByClient sync.Map // weak.Pointer[redis.Client or redis.ClusterClient] -> *libState

// libFor returns the library state of client c (a fresh one, never
// shared, for a client that cannot load it: those stay on EVALSHA).
func libFor(c redis.UniversalClient) *libState {
	switch c := c.(type) {
	case *redis.Client:
		return libOf(c)
	case *redis.ClusterClient:
		return libOf(c)
	}
	return &libState{}
}

func libOf[T any](c *T) *libState {
	key := weak.Make(c)
	if l, ok := libsByClient.Load(key); ok {
		return l.(*libState)
	}
	l, loaded := libsByClient.LoadOrStore(key, &libState{})
	if !loaded {
		runtime.AddCleanup(c, func(k weak.Pointer[T]) { libsByClient.Delete(k) }, key)
	}
	return l.(*libState)
}

// ready reports whether calls use FCALL.
func (l *libState) ready() bool { return l.mode.Load() == libReady }

// ScriptMode reports how the engine runs the scripts now: "fcall" once the
// library is loaded, "evalsha" for good when the server refused it (or the
// client cannot load it everywhere), "pending" until that is known.
func (e *Engine) ScriptMode() string {
	switch e.lib.mode.Load() {
	case libReady:
		return "fcall"
	case libRefused:
		return "evalsha"
	}
	switch e.cfg.Client.(type) {
	case *redis.Client, *redis.ClusterClient:
		return "pending"
	}
	return "evalsha"
}

// loadLibrary starts a background load of the library on the engine's
// client, unless one is in flight, it is loaded, the server refused it, or
// the last attempt failed less than bounds.LibRetry ago. It returns at once.
func (e *Engine) loadLibrary() {
	l := e.lib
	if l.mode.Load() != libUnknown {
		return
	}
	switch e.cfg.Client.(type) {
	case *redis.Client, *redis.ClusterClient:
	default: // a Ring or another client: no way to reach every server
		return
	}
	l.mu.Lock()
	wait := !l.failed.IsZero() && time.Since(l.failed) < bounds.LibRetry
	l.mu.Unlock()
	if wait || !l.mode.CompareAndSwap(libUnknown, libLoading) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), bounds.LibLoad)
	e.background(ctx, cancel, func(ctx context.Context) {
		err := loadLibrary(ctx, e.cfg.Client)
		name, _ := lua.Library()
		switch {
		case err == nil:
			l.mode.Store(libReady)
			e.cfg.logger().LogAttrs(context.Background(), slog.LevelDebug, "redsem: scripts run as Redis functions",
				slog.String("library", name))
		case refused(err):
			l.mode.Store(libRefused)
			msg := err.Error()
			if i := strings.IndexAny(msg, ",\n"); i > 0 {
				msg = msg[:i] // not the library's text, which the error may quote
			}
			e.cfg.logger().LogAttrs(context.Background(), slog.LevelDebug,
				"redsem: scripts run with EVALSHA: the server refused FUNCTION LOAD",
				slog.String("library", name), slog.String("error", msg))
		default:
			l.mu.Lock()
			l.failed = time.Now()
			l.mu.Unlock()
			l.mode.Store(libUnknown)
		}
	})
}

// loadLibrary loads the library on the client's server (on every master of
// a cluster). A library of that name that exists already is the same text:
// its name is its hash.
func loadLibrary(ctx context.Context, c redis.UniversalClient) error {
	_, src := lua.Library()
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, src).Err()
		if libraryExists(err) {
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
