package core

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// Demand notices let the users of a semaphore that hold slots without
// using them (redsemsql's idle pooled connections) learn that a caller
// waits for a slot, in any process: the waiter publishes on Keys.Want, the
// holders subscribe to it and give an unused slot back. They carry no
// state in Redis and cost nothing while nobody waits.

var (
	unwrapMu sync.RWMutex
	unwraps  []func(any) *Engine
)

// RegisterUnwrap adds f to the functions EngineOf tries: the fair and
// unfair packages register one that returns the engine behind their
// *Semaphore (and nil for any other value).
func RegisterUnwrap(f func(any) *Engine) {
	unwrapMu.Lock()
	defer unwrapMu.Unlock()
	unwraps = append(unwraps, f)
}

// EngineOf returns the engine behind a semaphore built by this module's
// fair or unfair package, also through wrappers that have a method
// Unwrap() redsem.Semaphore (redsemotel's), or nil for any other
// implementation.
func EngineOf(sem redsem.Semaphore) *Engine {
	unwrapMu.RLock()
	defer unwrapMu.RUnlock()
	for depth := 0; sem != nil && depth < 16; depth++ {
		for _, f := range unwraps {
			if e := f(sem); e != nil {
				return e
			}
		}
		u, ok := sem.(interface{ Unwrap() redsem.Semaphore })
		if !ok {
			return nil
		}
		sem = u.Unwrap()
	}
	return nil
}

// PublishDemand sends msg on the semaphore's demand channel (sharded
// pub/sub on a cluster, as the scripts publish).
func (e *Engine) PublishDemand(ctx context.Context, msg string) error {
	if e.pub == "SPUBLISH" {
		return e.cfg.Client.SPublish(ctx, e.keys.Want, msg).Err()
	}
	return e.cfg.Client.Publish(ctx, e.keys.Want, msg).Err()
}

// SubscribeDemand subscribes to the semaphore's demand channel. go-redis
// subscribes in the background and again after a reconnection; the caller
// reads ps.Channel() and closes ps when done.
func (e *Engine) SubscribeDemand(ctx context.Context) *redis.PubSub {
	if e.pub == "SPUBLISH" {
		return e.cfg.Client.SSubscribe(ctx, e.keys.Want)
	}
	return e.cfg.Client.Subscribe(ctx, e.keys.Want)
}
