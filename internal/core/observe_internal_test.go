package core

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A client that the allocator puts where a collected client was gets a
// dial hook of its own: clients are known by a weak pointer, not by their
// address. (Found with issue 33: known by "%p", such a client shared the
// collected one's hook, which it never calls, so its failed dials went
// unseen: an Acquire that Redis being down ended said a plain timeout, and
// TryAcquire waited out go-redis's retries.) It skips if no new client
// lands where an old one was.
func TestAlertsOfAReusedAddress(t *testing.T) {
	keys := KeysFor("redsem", "reused")
	opts := &redis.Options{Addr: "127.0.0.1:1"}
	old := map[string]*dialWatch{} // the collected clients' hooks, by address
	for range 100 {
		c := redis.NewClient(opts)
		old[fmt.Sprintf("%p", c)] = alertsFor(c, keys).dials
		_ = c.Close()
	}
	runtime.GC()
	for range 1000 {
		c := redis.NewClient(opts)
		at := fmt.Sprintf("%p", c)
		d, reused := old[at]
		if reused && alertsFor(c, keys).dials == d {
			t.Fatalf("a new client at %s shares the collected client's dial hook, and has none of its own", at)
		}
		_ = c.Close()
		if reused {
			return
		}
	}
	t.Skip("no new client was put where a collected one was")
}
