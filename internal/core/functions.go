package core

import (
	"context"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
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

// The library's state per client, and the load request itself, are package
// wire's (wire.Library, wire.Load); this file decides when to load and
// says what came of it.

// ScriptMode reports how the engine runs the scripts now: "fcall" once the
// library is loaded, "evalsha" for good when the server refused it (or the
// client cannot load it everywhere), "pending" until that is known.
func (e *Engine) ScriptMode() string {
	switch e.lib.Mode() {
	case wire.LibReady:
		return "fcall"
	case wire.LibRefused:
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
	if l.Mode() != wire.LibUnknown {
		return
	}
	switch e.cfg.Client.(type) {
	case *redis.Client, *redis.ClusterClient:
	default: // a Ring or another client: no way to reach every server
		return
	}
	if !l.Start() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), bounds.LibLoad)
	e.background(ctx, cancel, func(ctx context.Context) {
		err := wire.Load(ctx, e.cfg.Client)
		l.Done(err)
		name, _ := lua.Library()
		switch {
		case err == nil:
			e.rep.warn().LogAttrs(context.Background(), slog.LevelDebug, "redsem: scripts run as Redis functions",
				slog.String("library", name))
		case wire.Refused(err):
			msg := err.Error()
			if i := strings.IndexAny(msg, ",\n"); i > 0 {
				msg = msg[:i] // not the library's text, which the error may quote
			}
			e.rep.warn().LogAttrs(context.Background(), slog.LevelDebug,
				"redsem: scripts run with EVALSHA: the server refused FUNCTION LOAD",
				slog.String("library", name), slog.String("error", msg))
		}
	})
}
