package core

import "github.com/redis/go-redis/v9"

// DemandChannel is what a pool needs to carry demand notices for a
// semaphore (internal/connslots holds the protocol): the client, the
// semaphore's demand channel (Keys.Want, in its hash tag) and whether the
// client publishes sharded (a cluster, as the scripts publish).
type DemandChannel struct {
	Client  redis.UniversalClient
	Channel string
	Sharded bool
}

// Demand returns the semaphore's demand channel.
func (e *Engine) Demand() DemandChannel {
	return DemandChannel{Client: e.cfg.Client, Channel: e.keys.Want, Sharded: e.pub == "SPUBLISH"}
}
