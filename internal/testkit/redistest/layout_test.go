package redistest_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// TestLayoutCheck: the layout of a real fair semaphore (weighted holders
// under a rate, a waiter queued) passes Check, and each planted breach of
// an invariant, made on a copy of the snapshot, is reported by its kind.
func TestLayoutCheck(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	name := redistest.Name(t)
	rate := redsem.Rate{Limit: 5, Per: time.Minute}
	sem, err := fair.New(rdb, name, 3, fair.Options{LeaseTTL: 10 * time.Second, Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	a, err := sem.TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sem.TryAcquireN(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil { // a tombstone, a free slot
		t.Fatal(err)
	}
	if b, err = sem.TryAcquireN(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := sem.AcquireN(wctx, 1)
		waited <- err
	}()
	redistest.WaitFor(t, 5*time.Second, "the waiter to queue", func() (bool, error) {
		st, err := sem.Status(ctx)
		return err == nil && len(st.Waiters) == 1, err
	})
	keys := core.KeysFor(core.DefaultPrefix, name).List
	l, err := redistest.ReadLayout(ctx, rdb, keys)
	cancel()
	<-waited
	if err != nil {
		t.Fatal(err)
	}
	if p := l.Check(3); !p.OK() {
		t.Fatalf("a real layout fails the check: %v", p)
	}
	if len(l.Holders) != 2 || len(l.Queue) != 1 || len(l.Free) != 0 || len(l.Window) != 3 || len(l.Ended) != 1 {
		t.Fatalf("unexpected layout: %+v", l)
	}
	aID, bID, wID := a.ID(), b.ID(), l.Queue[0].Member.(string)
	aRec, bRec := l.Meta[aID], l.Meta[bID]
	fresh := func() *redistest.Layout {
		c := *l
		c.Meta = maps.Clone(l.Meta)
		c.Holders, c.Queue, c.Sessions = slices.Clone(l.Holders), slices.Clone(l.Queue), slices.Clone(l.Sessions)
		c.Free, c.Ended, c.Window = slices.Clone(l.Free), slices.Clone(l.Ended), slices.Clone(l.Window)
		return &c
	}
	cases := []struct {
		want  string
		limit int
		plant func(c *redistest.Layout)
	}{
		{"_used is not the slots held", 3, func(c *redistest.Layout) { c.Meta["_used"] = "2" }},
		{"_q is not the queue's length", 3, func(c *redistest.Layout) { c.Meta["_q"] = "0" }},
		{"id both queued and holding", 3, func(c *redistest.Layout) {
			c.Queue = append(c.Queue, redis.Z{Member: aID, Score: 99})
			c.Meta["_q"], c.Meta["_seq"] = "2", "99"
		}},
		{"holder entry without a lease record", 3, func(c *redistest.Layout) { c.Meta[aID] = "R" }},
		{"lease record without a holder entry", 3, func(c *redistest.Layout) { c.Holders = c.Holders[:0] }},
		{"queue entry without a waiter record", 3, func(c *redistest.Layout) { delete(c.Meta, wID) }},
		{"waiter record without a queue entry", 3, func(c *redistest.Layout) { c.Queue = nil; c.Meta["_q"] = "0" }},
		{"waiter's session not listed", 3, func(c *redistest.Layout) { c.Sessions = nil }},
		{"slot held twice", 3, func(c *redistest.Layout) {
			c.Meta[bID] = strings.Replace(bRec, "|2|", "|1|", 1) // b's slot 2 -> a's slot 1
		}},
		{"slots neither held nor free", 3, func(c *redistest.Layout) { c.Meta["_hw"] = "4" }},
		{"slot free and held", 3, func(c *redistest.Layout) { c.Free = append(c.Free, "0") }},
		{"token shared by two leases", 3, func(c *redistest.Layout) {
			tok := strings.Split(aRec, "|")[1]
			f := strings.Split(bRec, "|")
			f[1] = tok
			c.Meta[bID] = strings.Join(f, "|")
		}},
		{"token above _token", 3, func(c *redistest.Layout) { c.Meta["_token"] = "1" }},
		{"keys expire before the clock passes _token", 3, func(c *redistest.Layout) {
			c.Meta["_token"] = strconv.FormatInt(c.NowUs+time.Hour.Microseconds(), 10)
		}},
		{"arrival above _seq", 3, func(c *redistest.Layout) { c.Meta["_seq"] = "0" }},
		{"tombstone without an ended entry", 3, func(c *redistest.Layout) { c.Ended = nil }},
		{"_next above a holder deadline", 3, func(c *redistest.Layout) { c.Meta["_next"] = "inf" }},
		{"holder outlives the horizon _hz", 3, func(c *redistest.Layout) { c.Meta["_hz"] = "1" }},
		{"SetLimit's key and _fixed differ", 3, func(c *redistest.Layout) { c.Meta["_fixed"] = "3" }},
		{"live holders hold more than the limit", 2, func(c *redistest.Layout) {}},
		{"live holder's slot not below the limit", 2, func(c *redistest.Layout) {}},
		{"rate window over its limit", 3, func(c *redistest.Layout) {
			for i := 0; i < 3; i++ {
				z := c.Window[0]
				tok := int64(z.Score) + int64(i) + 1
				c.Window = append(c.Window, redis.Z{Member: strconv.FormatInt(tok, 10) + ":1", Score: float64(tok)})
			}
			c.Meta["_rsum"] = "9"
		}},
		{"_rsum below the window's records", 3, func(c *redistest.Layout) { c.Meta["_rsum"] = "1" }},
	}
	for _, tc := range cases {
		c := fresh()
		tc.plant(c)
		p := c.Check(tc.limit)
		if !slices.Contains(p.Kinds(), tc.want) {
			t.Errorf("planted %q: Check found %q", tc.want, p.Summary())
		}
	}
}
