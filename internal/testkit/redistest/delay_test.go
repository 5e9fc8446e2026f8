package redistest_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// TestDelayerHoldsReplyAfterRun: a held reply comes after the command ran:
// another client sees its effect (a BLPOP woken by the held LPUSH) while
// the LPUSH call has not returned yet, and the reply is intact.
func TestDelayerHoldsReplyAfterRun(t *testing.T) {
	srv := redistest.Shared(t)
	clean := srv.Client(t)
	d := redistest.NewDelayer(redistest.DelayConfig{})
	c := d.NewClient(srv.Options())
	defer c.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	key := redistest.Name(t)
	d.HoldNext(redistest.MatchCommands("lpush"), redistest.MaxDelay)
	done := make(chan int64, 1)
	go func() { done <- c.LPush(ctx, key, "x").Val() }()
	v, err := clean.BLPop(ctx, 5*time.Second, key).Result()
	if err != nil || v[1] != "x" {
		t.Fatalf("BLPOP: %v %v", v, err)
	}
	select {
	case n := <-done:
		t.Fatalf("LPUSH returned (%d) before its effect was seen elsewhere: its reply was not held", n)
	default:
	}
	if n := <-done; n != 1 {
		t.Fatalf("held LPUSH replied %d, want 1", n)
	}
	if st := d.Stats(); st.HeldReplies != 1 {
		t.Fatalf("stats %+v, want one held reply", st)
	}
}

// TestDelayerSelectsAndSwitches: random holds apply to the selected
// commands only, and not at all while the Delayer is off; HoldNext applies
// while off too.
func TestDelayerSelectsAndSwitches(t *testing.T) {
	srv := redistest.Shared(t)
	d := redistest.NewDelayer(redistest.DelayConfig{Seed: 1, Replies: redistest.MatchCommands("get"), ReplyOdds: 1, Max: time.Millisecond})
	c := d.NewClient(srv.Options())
	defer c.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	key := redistest.Name(t)
	for i := 0; i < 5; i++ {
		c.Set(ctx, key, i, 0)
		if v, err := c.Get(ctx, key).Int(); err != nil || v != i {
			t.Fatalf("GET %d: %v", v, err)
		}
	}
	if st := d.Stats(); st.HeldReplies != 5 {
		t.Fatalf("held %d replies, want the 5 GETs'", st.HeldReplies)
	}
	d.SetOn(false)
	for i := 0; i < 5; i++ {
		c.Get(ctx, key)
	}
	if st := d.Stats(); st.HeldReplies != 5 {
		t.Fatalf("held %d replies, want none more while off", st.HeldReplies-5)
	}
	d.HoldNext(redistest.MatchCommands("set"), time.Millisecond)
	c.Get(ctx, key)
	c.Set(ctx, key, 1, 0)
	if st := d.Stats(); st.HeldReplies != 6 {
		t.Fatalf("held %d replies while off, want the one SET chosen", st.HeldReplies-5)
	}
}

// TestDelayerMatchScript: MatchScript selects the calls of one script by
// EVALSHA and by EVAL, and no other script.
func TestDelayerMatchScript(t *testing.T) {
	srv := redistest.Shared(t)
	d := redistest.NewDelayer(redistest.DelayConfig{})
	d.SetOn(false)
	c := d.NewClient(srv.Options())
	defer c.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	a := redis.NewScript("return 1 -- " + redistest.Name(t))
	b := redis.NewScript("return 2 -- " + redistest.Name(t))
	m := redistest.MatchScript(a.Hash(), "")
	for i := 0; i < 3; i++ {
		d.HoldNext(m, time.Millisecond)
	}
	if v, err := b.Run(ctx, c, nil).Int(); err != nil || v != 2 { // EVALSHA (NOSCRIPT), EVAL
		t.Fatalf("script b: %v %v", v, err)
	}
	if n := d.Stats().HeldReplies; n != 0 {
		t.Fatalf("another script's reply was held (%d)", n)
	}
	if v, err := a.Run(ctx, c, nil).Int(); err != nil || v != 1 { // EVALSHA (NOSCRIPT), EVAL: both held
		t.Fatalf("script a: %v %v", v, err)
	}
	if v, err := a.Run(ctx, c, nil).Int(); err != nil || v != 1 { // EVALSHA: held
		t.Fatalf("script a again: %v %v", v, err)
	}
	if n := d.Stats().HeldReplies; n != 3 {
		t.Fatalf("held %d replies of script a, want 3 (EVALSHA refused, EVAL, EVALSHA)", n)
	}
}

// TestDelayerHoldsPubSub: a message published while HoldPubSub holds the
// subscriber's connection reaches it after a reply that the same client's
// command connection read later, intact.
func TestDelayerHoldsPubSub(t *testing.T) {
	srv := redistest.Shared(t)
	clean := srv.Client(t)
	d := redistest.NewDelayer(redistest.DelayConfig{})
	d.SetOn(false)
	c := d.NewClient(srv.Options())
	defer c.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	ch := redistest.Name(t)
	ps := c.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	if st := d.Stats(); st.PubSubConns != 1 {
		t.Fatalf("stats %+v: the subscriber's connection was not seen to subscribe", st)
	}
	got := make(chan string, 1)
	go func() {
		m, err := ps.ReceiveMessage(ctx)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- m.Payload
	}()
	d.HoldPubSub(redistest.MaxDelay)
	if n, err := clean.Publish(ctx, ch, "hello").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH: %d %v", n, err)
	}
	if err := c.Ping(ctx).Err(); err != nil { // a command connection: not held
		t.Fatal(err)
	}
	select {
	case m := <-got:
		t.Fatalf("message %q arrived before a later reply: not held", m)
	default:
	}
	if m := <-got; m != "hello" {
		t.Fatalf("message %q, want hello", m)
	}
	if st := d.Stats(); st.HeldReads == 0 {
		t.Fatalf("stats %+v: no read held", st)
	}
}

// TestDelayerLosesNothing: under random holds of replies, of reads on
// slow connections and of pub/sub reads, counters written concurrently
// add up and every message arrives once, in order, unchanged.
func TestDelayerLosesNothing(t *testing.T) {
	srv := redistest.Shared(t)
	clean := srv.Client(t)
	d := redistest.NewDelayer(redistest.DelayConfig{Seed: 7, ReplyOdds: 0.5, ReadOdds: 0.5, SlowConnOdds: 0.5, Max: 2 * time.Millisecond})
	c := d.NewClient(srv.Options())
	defer c.Close()
	ctx := redistest.Ctx(t, 30*time.Second)
	key, ch := redistest.Name(t), redistest.Name(t)
	ps := c.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	const workers, each, msgs = 4, 40, 100
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < each; i++ {
				if _, err := c.Incr(ctx, key).Result(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := 0; i < msgs; i++ {
			m, err := ps.ReceiveMessage(ctx)
			if err != nil {
				errs <- err
				return
			}
			if m.Payload != strconv.Itoa(i) {
				errs <- fmt.Errorf("message %d is %q", i, m.Payload)
				return
			}
		}
	})
	for i := 0; i < msgs; i++ {
		if err := clean.Publish(ctx, ch, strconv.Itoa(i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n, err := c.Get(ctx, key).Int(); err != nil || n != workers*each {
		t.Fatalf("counter %d (%v), want %d", n, err, workers*each)
	}
	if st := d.Stats(); st.HeldReplies == 0 || st.HeldReads == 0 {
		t.Fatalf("stats %+v: nothing held, the test proves nothing", st)
	}
}

// TestDelayerHoldEndsWithContext: a held reply is delivered (not lost)
// when the caller's context ends before the hold does.
func TestDelayerHoldEndsWithContext(t *testing.T) {
	srv := redistest.Shared(t)
	d := redistest.NewDelayer(redistest.DelayConfig{})
	c := d.NewClient(srv.Options())
	defer c.Close()
	key := redistest.Name(t)
	d.HoldNext(redistest.MatchCommands("incr"), redistest.MaxDelay)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		n, err := c.Incr(ctx, key).Result()
		if err == nil && n != 1 {
			err = fmt.Errorf("INCR replied %d", n)
		}
		done <- err
	}()
	redistest.WaitFor(t, 5*time.Second, "the INCR to run", func() (bool, error) {
		return d.Stats().HeldReplies == 1, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("held reply cut by its context: %v, want the reply", err)
	}
}
