package core

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Demand notices let the users of a semaphore that hold slots without
// using them (redsemsql's idle pooled connections) learn that a caller
// waits for a slot, in any process: the waiter publishes on Keys.Want, the
// holders subscribe to it and give an unused slot back. They carry no
// state in Redis and cost nothing while nobody waits.

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

// ClaimDemand claims the demand notice notice for this caller: true for the
// first caller (SET NX of a key in the semaphore's hash tag, kept ttl), so
// that one holder answers each notice.
func (e *Engine) ClaimDemand(ctx context.Context, notice string, ttl time.Duration) (bool, error) {
	return e.cfg.Client.SetNX(ctx, e.keys.Want+":claim:"+notice, 1, ttl).Result()
}
