package connslots

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// Demand notices let the users of a semaphore that hold slots without
// using them (idle pooled connections) learn that a caller waits for a
// slot, in any process: the waiter publishes on the semaphore's demand
// channel, the holders subscribe to it and give an unused slot back, and
// one holder claims each notice. They carry no state in Redis beyond the
// claims (which expire) and cost nothing while nobody waits.
type demand core.DemandChannel

// demandOf is the demand channel of sem, nil when sem is not one of this
// module's semaphores (demand then stays within the pool).
func demandOf(sem redsem.Semaphore) *demand {
	e := core.EngineOf(sem)
	if e == nil {
		return nil
	}
	d := demand(e.Demand())
	return &d
}

// publish sends msg on the demand channel (sharded pub/sub on a cluster,
// as the scripts publish).
func (d *demand) publish(ctx context.Context, msg string) error {
	if d.Sharded {
		return d.Client.SPublish(ctx, d.Channel, msg).Err()
	}
	return d.Client.Publish(ctx, d.Channel, msg).Err()
}

// subscribe subscribes to the demand channel. go-redis subscribes in the
// background and again after a reconnection; the caller reads
// ps.Channel() and closes ps when done.
func (d *demand) subscribe(ctx context.Context) *redis.PubSub {
	if d.Sharded {
		return d.Client.SSubscribe(ctx, d.Channel)
	}
	return d.Client.Subscribe(ctx, d.Channel)
}

// claim claims the demand notice notice for this caller: true for the
// first caller (SET NX of a key in the semaphore's hash tag, kept ttl), so
// that one holder answers each notice.
func (d *demand) claim(ctx context.Context, notice string, ttl time.Duration) (bool, error) {
	return d.Client.SetNX(ctx, d.Channel+":claim:"+notice, 1, ttl).Result()
}
