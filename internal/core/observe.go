package core

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/redsem/redsem"
)

// emit reports ev to the Observer and the Logger, if set. Both nil costs a
// pair of nil checks.
func (e *Engine) emit(ev redsem.Event) {
	if e.cfg.Observer == nil && e.cfg.Logger == nil {
		return
	}
	ev.Name = e.cfg.Name
	if e.cfg.Observer != nil {
		e.cfg.Observer(ev)
	}
	if e.cfg.Logger != nil {
		e.log(ev)
	}
}

func (e *Engine) log(ev redsem.Event) {
	level := slog.LevelDebug
	switch ev.Kind {
	case redsem.EventLeaseLost, redsem.EventWaiterEvicted, redsem.EventLimitMismatch,
		redsem.EventEvictionPolicy, redsem.EventAcquireFailed:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{slog.String("semaphore", ev.Name)}
	if ev.LeaseID != "" {
		attrs = append(attrs, slog.String("lease", ev.LeaseID), slog.Int("slot", ev.Slot), slog.Int64("token", ev.Token))
	}
	if ev.Wait != 0 {
		attrs = append(attrs, slog.Duration("wait", ev.Wait))
	}
	if ev.Hold != 0 {
		attrs = append(attrs, slog.Duration("hold", ev.Hold))
	}
	if ev.Policy != "" {
		attrs = append(attrs, slog.String("maxmemory_policy", ev.Policy))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	e.cfg.Logger.LogAttrs(context.Background(), level, "redsem: "+ev.Kind.String(), attrs...)
}

// EvictingPolicy reports whether a maxmemory-policy may evict keys that have
// a TTL (all of a semaphore's keys but the SetLimit override have one).
func EvictingPolicy(policy string) bool {
	return strings.HasPrefix(policy, "allkeys-") || strings.HasPrefix(policy, "volatile-")
}

// checkEvictionPolicy reads maxmemory-policy once per Engine, at first use,
// and reports an EventEvictionPolicy if it can evict the semaphore's keys.
// A server that refuses CONFIG (managed Redis) is not an error. The check
// runs on its own goroutine (at most a second); the call that triggered it
// waits for it only while its own context runs.
func (e *Engine) checkEvictionPolicy(ctx context.Context) {
	if e.fam != nil {
		e.fam.root.checkEvictionPolicy(ctx) // once per family
		return
	}
	e.policyOnce.Do(func() {
		done := make(chan struct{})
		e.policyDone = done
		defer func() {
			select {
			case <-done:
			case <-ctx.Done():
			}
		}()
		go func() {
			defer close(done)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			v, err := e.cfg.Client.ConfigGet(cctx, "maxmemory-policy").Result()
			if err != nil {
				return
			}
			e.policy = v["maxmemory-policy"]
			if EvictingPolicy(e.policy) {
				e.emit(redsem.Event{Kind: redsem.EventEvictionPolicy, Policy: e.policy})
			}
		}()
	})
}

// MaxMemoryPolicy returns the policy read at first use ("" before that, or
// when the server does not allow CONFIG GET); it waits for a check in
// progress (at most a second).
func (e *Engine) MaxMemoryPolicy() string {
	if e.fam != nil {
		return e.fam.root.MaxMemoryPolicy()
	}
	e.policyOnce.Do(func() {}) // no check yet: none will run
	if e.policyDone != nil {
		<-e.policyDone
	}
	return e.policy
}
