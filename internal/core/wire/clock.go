package wire

import (
	"context"
	"sync"
	"time"

	"github.com/redsem/redsem/internal/bounds"
)

// The server's clock: requests are bounded in server time (RefuseAfter), and
// the lifetimes scripts report become local deadlines that are never late.

// RefuseAfter is the server time (ms) after which an acquire request of a
// call with ctx must write nothing, 0 for none. A request that reaches
// Redis after its caller gave up (held in the network, or behind a paused
// server) must write nothing, even once its undo's cancellation record is
// gone: the script is told when that is, the context's deadline in server
// time, with a second's margin for the clocks' drift. A context without a
// deadline (or cancelled long before it) relies on the cancellation record
// alone.
func (d *Door) RefuseAfter(ctx context.Context) (int64, error) {
	return d.refuseAfterMargin(ctx, bounds.AcquireMargin)
}

// refuseAfterMargin is RefuseAfter with margin ms after the deadline.
func (d *Door) refuseAfterMargin(ctx context.Context, margin int64) (int64, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	s, known := d.clock.serverAt(dl)
	if !known {
		// Once per Door: the first call has no reply to go by. A failure
		// to reach Redis is the acquire's; any other error leaves this one
		// request bounded by its cancellation record only.
		if err := d.readClock(ctx); err != nil && (ctx.Err() != nil || Transient(err)) {
			return 0, err
		}
		if s, known = d.clock.serverAt(dl); !known {
			return 0, nil
		}
	}
	return s + margin, nil
}

// readClock reads the server's clock (TIME) within ctx, so that the first
// acquire of an engine can bound its request in server time too. Its errors
// are raw (the acquire call classifies them).
func (d *Door) readClock(ctx context.Context) error {
	sent := time.Now()
	if err := d.Watch.Ready(ctx); err != nil {
		d.Watch.Answered(sent, err)
		return err
	}
	v, err := Bounded(ctx, func() ([]any, error) {
		var t time.Time
		err := onLiveConn(ctx, func() (err error) {
			t, err = d.Client.Time(ctx).Result()
			return err
		})
		if err != nil {
			return nil, err
		}
		return []any{t.UnixMilli()}, nil
	})
	d.Watch.Answered(sent, err)
	if err != nil {
		return err
	}
	d.clock.observe(sent, v[0].(int64))
	return nil
}

// LocalAtLeast returns an early local estimate of server time serverMs, by
// the Door's clock (from its latest reply).
func (d *Door) LocalAtLeast(serverMs int64) time.Time { return d.clock.localAtLeast(serverMs) }

// serverClock relates the Redis server's clock to the local monotonic clock,
// from the latest reply: server time ns happened after local time sent, so
// the local time of any later server instant x is at least sent + (x - ns).
type serverClock struct {
	mu   sync.Mutex
	sent time.Time
	ns   int64
}

func (c *serverClock) observe(sent time.Time, serverMs int64) {
	c.mu.Lock()
	c.sent, c.ns = sent, serverMs
	c.mu.Unlock()
}

// serverAt returns a late estimate (an upper bound, clocks' drift aside) of
// the server time, in ms, at local time t: the server read ns after local
// time sent, so at t it reads at most ns + (t - sent). It reports false
// before the first reply.
func (c *serverClock) serverAt(t time.Time) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent.IsZero() {
		return 0, false
	}
	return c.ns + t.Sub(c.sent).Milliseconds() + 1, true
}

// localAtLeast returns an early local estimate of server time serverMs.
func (c *serverClock) localAtLeast(serverMs int64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent.IsZero() {
		return time.Now()
	}
	return c.sent.Add(time.Duration(serverMs-c.ns) * time.Millisecond)
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// expiresBy turns a lifetime that a script reported, ms from the server time
// it read, into a local deadline that is never late, given a local time
// before that read (when the request was sent). Scripts keep deadlines in
// whole milliseconds of truncated server time, and an entry is gone once the
// truncated time reaches its deadline, so by the exact clock it may end up
// to a millisecond before base + ms: the estimate takes that millisecond off.
func expiresBy(base time.Time, ms int64) time.Time {
	return base.Add(time.Duration(ms)*time.Millisecond - time.Millisecond)
}
