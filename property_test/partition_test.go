package property_test

// Partitions, not only crashes (docs/reliability.md, "Partitions"): each
// client of a history talks to Redis through a proxy of its own
// (redistest.Proxy), so that one client can be cut off, lose its replies or
// be held across a heal while the others go on; every history is checked
// with the linearizability checker (linearizability_test.go, the model in
// linmodel_test.go, which lets leases of a short TTL expire by time).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// partitioned is the clients of one history, each behind its own proxy.
type partitioned struct {
	name    string
	limit   int
	ttl     time.Duration // 0: leases outlive the history (linTTL)
	sems    []redsem.Semaphore
	proxies []*redistest.Proxy
	direct  *redis.Client // no proxy: for the test's own reads
	rec     *linRecorder
	w       linWorkload // what random calls do
}

// newPartitioned builds n clients of a new semaphore of limit on srv, each
// through its own proxy, with go-redis's retries (MaxRetries) and a 1 s
// read timeout; their leases last ttl (0: linTTL, longer than any history).
func newPartitioned(t *testing.T, srv *redistest.Server, newSem newSemFunc, n, limit int, ttl time.Duration, retries int) *partitioned {
	t.Helper()
	p := &partitioned{name: redistest.Name(t) + fmt.Sprintf("-%08x", rand.Uint32()), limit: limit, ttl: ttl,
		direct: srv.Client(t), w: linWorkload{limit: limit, maxHeld: 1}}
	leaseTTL := ttl
	if leaseTTL == 0 {
		leaseTTL = linTTL
	}
	for range n {
		px := redistest.StartProxy(t, srv.Addr)
		opt := srv.Options()
		opt.Addr, opt.MaxRetries = px.Addr, retries
		opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		s, err := newSem(c, p.name, limit, leaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		p.sems = append(p.sems, s)
		p.proxies = append(p.proxies, px)
	}
	p.rec = newLinRecorder(true)
	return p
}

// randomCalls makes client ci call at random (a few ms apart, so that a
// history stays a few hundred calls long) until stop is closed, and returns
// the leases it still holds.
func (p *partitioned) randomCalls(ci int, stop <-chan struct{}) []redsem.Lease {
	rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(ci)))
	var held []redsem.Lease
	for {
		select {
		case <-stop:
			return held
		case <-time.After(3 * time.Millisecond):
		}
		p.rec.random(ci, p.sems[ci], p.w, rng, &held)
	}
}

// run makes the clients from first on call at random while script runs (it
// drives the others, and returns the leases they still hold), then records
// the final Status, checks the history and the keys' layout, and releases
// what is left.
func (p *partitioned) run(t *testing.T, label string, first int, script func() []redsem.Lease) linHistory {
	t.Helper()
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		leftover []redsem.Lease
	)
	for ci := first; ci < len(p.sems); ci++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held := p.randomCalls(ci, stop)
			mu.Lock()
			leftover = append(leftover, held...)
			mu.Unlock()
		}()
	}
	func() {
		defer func() { close(stop); wg.Wait() }() // also when script fails the test
		held := script()
		mu.Lock()
		leftover = append(leftover, held...)
		mu.Unlock()
	}()
	for _, px := range p.proxies {
		px.SetFaults(0, 0)
		px.SetStall(false, false)
		px.SetBlackhole(false)
	}
	h := p.rec.history(t, p.sems[len(p.sems)-1], p.limit, p.ttl)
	if res, msg := checkHistory(t, label, h, true); res != porcupine.Ok {
		t.Error(msg)
	}
	releaseAll(leftover)
	ctx := redistest.Ctx(t, 10*time.Second)
	l, err := redistest.ReadLayout(ctx, p.direct, core.KeysFor(core.DefaultPrefix, p.name).List)
	if err != nil {
		t.Fatal(err)
	}
	if pr := l.Check(0); !pr.OK() {
		t.Errorf("%s: the keys break the Lua library's layout: %s", label, pr)
	}
	return h
}

// unknown counts the calls of client ci recorded so far whose outcome is
// unknown.
func (r *linRecorder) unknown(ci int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, op := range r.ops {
		if op.ClientId == ci && op.Output.(linOut).res == resUnknown {
			n++
		}
	}
	return n
}

// holderDeadline reads the deadline that Redis keeps for lease id (server
// ms), or fails the test.
func (p *partitioned) holderDeadline(t *testing.T, id string) int64 {
	t.Helper()
	ctx := redistest.Ctx(t, 5*time.Second)
	ms, err := p.direct.ZScore(ctx, core.KeysFor(core.DefaultPrefix, p.name).List[core.KeyHolders], id).Result()
	if err != nil {
		t.Fatalf("holder entry of %s: %v", id, err)
	}
	return int64(ms)
}

// A holder cut off from Redis (a black hole between it and Redis) while
// others keep calling: its lease ends locally at Deadline(), which is never
// after the deadline Redis keeps, so Redis hands its slot on only after the
// holder has stopped believing (margin >= 0); the history, with the lease
// expiring by Redis's clock, is linearizable. Limit 1, so that the next
// grant is the next holder of the cut-off holder's slot. The margins are
// logged: Deadline() before Redis's deadline, the next grant of the slot
// after Deadline() (its token is Redis's time of the handover, in µs), and
// when Done closed (at Deadline(): the loss is one moment; the give-up into
// the black hole runs after it, in the background).
func TestPartitionCutOffHolder(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = time.Second
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := newPartitioned(t, srv, v.newSem, 3, 1, ttl, 3)
			var (
				l0                 redsem.Lease
				local              time.Time // l0's Deadline()
				redisMs            int64     // l0's deadline in Redis
				doneAt, blackholed time.Time
			)
			p.run(t, "cutoff-"+v.name, 1, func() []redsem.Lease {
				for l0 == nil {
					var ok bool
					if l0, ok = p.rec.try(0, p.sems[0]); !ok {
						t.Fatal("TryAcquire failed without a fault")
					}
					time.Sleep(3 * time.Millisecond)
				}
				local = l0.Deadline()
				redisMs = p.holderDeadline(t, l0.ID())
				p.proxies[0].SetBlackhole(true)
				blackholed = time.Now()
				select {
				case <-l0.Done():
					doneAt = time.Now()
				case <-time.After(ttl + 5*time.Second):
					t.Fatalf("the cut-off lease did not end within %v of its deadline", time.Until(local)+5*time.Second)
				}
				if !errors.Is(l0.Err(), redsem.ErrLeaseLost) {
					t.Fatalf("the cut-off lease ended with Err %v, want ErrLeaseLost", l0.Err())
				}
				// ErrLeaseLost, known locally without asking Redis: not an op
				// of the history (the slot may still be held in Redis until
				// its own deadline, a few ms later; the model expires it by
				// Redis's clock).
				if err := l0.Release(context.Background()); !errors.Is(err, redsem.ErrLeaseLost) {
					t.Fatalf("Release of the cut-off lease after its loss: %v, want ErrLeaseLost", err)
				}
				p.proxies[0].SetBlackhole(false)
				time.Sleep(100 * time.Millisecond) // others call after the heal too
				return nil
			})
			// The next holder of the slot: the first grant after l0 (limit 1).
			var next int64
			for _, op := range p.rec.ops {
				if o := op.Output.(linOut); op.Input.(linIn).kind == opTry && o.res == resOK && o.token > l0.Token() &&
					(next == 0 || o.token < next) {
					next = o.token
				}
			}
			if next == 0 {
				t.Fatal("nobody was granted the cut-off holder's slot after it")
			}
			margin := redisMs*1000 - local.UnixMicro()
			handover := next - local.UnixMicro()
			t.Logf("cut off %v before Deadline(); Deadline() %.1f ms before Redis's deadline; slot handed on %.1f ms after Deadline(); Done closed %.1f ms after Deadline() (%.1f ms after the handover)",
				local.Sub(blackholed).Round(time.Millisecond), ms(margin), ms(handover), ms(doneAt.Sub(local).Microseconds()),
				ms(doneAt.UnixMicro()-next))
			if margin < 0 {
				t.Errorf("Deadline() is %.1f ms after the deadline Redis keeps", -ms(margin))
			}
			if handover < 0 {
				t.Errorf("the slot was handed on %.1f ms before the cut-off holder's Deadline()", -ms(handover))
			}
		})
	}
}

// ms turns µs into ms.
func ms(us int64) float64 { return float64(us) / 1000 }

// A client whose replies are lost while its commands reach Redis (the
// proxy loses the replies of requests that name the semaphore's keys, the
// scripts' and nothing else): first the reply to the first request of each
// call (go-redis re-sends it, and the re-sent acquire, release or status is
// answered from the records of the first run), then every reply (each call
// fails after its retries, its outcome unknown; an abandoned acquire is
// undone), while three others go on. The history is linearizable, and the
// keys keep the library's layout: one grant per call, no slot leaked.
func TestPartitionRepliesLost(t *testing.T) {
	srv := redistest.Start(t)
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := newPartitioned(t, srv, v.newSem, 4, 2, 0, 3)
			px := p.proxies[0]
			type tally struct{ calls, dropped, unknown int }
			var resent, lost tally
			p.run(t, "replies-lost-"+v.name, 1, func() []redsem.Lease {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
				var held []redsem.Lease
				// call is one call of client 0: at random, or (tries) a
				// TryAcquire, whose lease is left to the engine's undo.
				tries := false
				phase := func(drop, calls int) tally {
					n := tally{calls: calls}
					before := p.rec.unknown(0)
					for range calls {
						was, _ := px.Faults()
						px.DropMatching([]byte(p.name), drop)
						if tries {
							p.rec.try(0, p.sems[0])
						} else {
							p.rec.random(0, p.sems[0], p.w, rng, &held)
						}
						if now, _ := px.Faults(); now > was {
							n.dropped++
						}
					}
					px.DropMatching(nil, 0)
					n.unknown = p.rec.unknown(0) - before
					return n
				}
				phase(0, 10)
				resent = phase(1, 40)
				tries = true
				lost = phase(-1, 2)
				tries = false
				phase(0, 20)
				return held
			})
			t.Logf("client 0: %d calls lost their first reply, %d of them of unknown outcome; %d calls lost every reply, %d of them of unknown outcome (a Status that failed is left out of the history)",
				resent.dropped, resent.unknown, lost.dropped, lost.unknown)
			if resent.dropped < resent.calls/2 || resent.unknown > 0 {
				t.Errorf("%d calls lost their first reply and %d ended of unknown outcome: want most and none", resent.dropped, resent.unknown)
			}
			if lost.unknown == 0 {
				t.Error("no call that lost every reply ended of unknown outcome")
			}
		})
	}
}

// A partition that heals while calls are in flight: the proxy holds one
// client's replies (then its requests and replies) without losing a byte,
// and lets them go: calls whose request ran before the heal return after
// it. A hold shorter than the client's read timeout (1 s) only makes calls
// slow; a longer one (1.5 s) makes go-redis give up on the connection and
// re-send the request on a new one, whose reply, held too, comes after the
// heal: the second run of the script is answered from the records of the
// first. The history is linearizable and the keys keep the library's
// layout.
func TestPartitionHealsMidCall(t *testing.T) {
	srv := redistest.Start(t)
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := newPartitioned(t, srv, v.newSem, 4, 2, 0, 3)
			px := p.proxies[0]
			var heals []int64 // recorder times of the heals
			stop := make(chan struct{})
			var calls sync.WaitGroup
			var held []redsem.Lease
			calls.Add(1)
			h := p.run(t, "heals-"+v.name, 1, func() []redsem.Lease {
				go func() {
					defer calls.Done()
					held = p.randomCalls(0, stop)
				}()
				for _, hold := range []struct {
					requests bool
					d        time.Duration
				}{{false, 300 * time.Millisecond}, {true, 300 * time.Millisecond}, {false, 1500 * time.Millisecond}} {
					time.Sleep(150 * time.Millisecond)
					px.SetStall(hold.requests, true)
					time.Sleep(hold.d)
					px.SetStall(false, false)
					heals = append(heals, p.rec.now())
				}
				time.Sleep(150 * time.Millisecond)
				close(stop)
				calls.Wait()
				return held
			})
			across, resent, unknown := 0, 0, 0
			for _, op := range h.ops {
				if op.ClientId != 0 {
					continue
				}
				if op.Output.(linOut).res == resUnknown {
					unknown++
					continue
				}
				for _, at := range heals {
					if op.Call < at && op.Return > at {
						across++
					}
				}
				if time.Duration(op.Return-op.Call) > time.Second { // the read timeout: sent again
					resent++
				}
			}
			t.Logf("client 0: %d calls answered across a heal, %d of them after a re-send; %d of unknown outcome", across, resent, unknown)
			if across == 0 || resent == 0 {
				t.Errorf("%d calls answered across a heal, %d after a re-send: want some of each", across, resent)
			}
		})
	}
}

// The model's expiry, on histories made up by hand: a lease of 100 ms
// granted during [0, 1] ms may vanish only for calls that return from
// 95 ms on (its call plus the TTL, less expirySlop), and is gone for calls
// made after 106 ms (its return plus the TTL, plus expirySlop).
func TestLinModelExpiry(t *testing.T) {
	const ttl = 100 * time.Millisecond
	at := func(client int, from, to float64, in linIn, out linOut) porcupine.Operation {
		in.call, in.ret = int64(from*1e6), int64(to*1e6)
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: in.call, Return: in.ret}
	}
	grantA := at(0, 0, 1, linIn{kind: opTry}, linOut{res: resOK, id: "a", slot: 0, token: 10})
	grantB := func(from, to float64) porcupine.Operation {
		return at(1, from, to, linIn{kind: opTry}, linOut{res: resOK, id: "b", slot: 0, token: 20})
	}
	refused := func(from, to float64) porcupine.Operation {
		return at(1, from, to, linIn{kind: opTry}, linOut{res: resNoSlot})
	}
	status := func(from, to float64, holders ...linHolder) porcupine.Operation {
		return at(1, from, to, linIn{kind: opStatus}, linOut{res: resOK, limit: 1, holders: holders})
	}
	releaseA := func(from, to float64, res linResult) porcupine.Operation {
		return at(0, from, to, linIn{kind: opRelease, id: "a"}, linOut{res: res})
	}
	a := linHolder{id: "a", slot: 0, token: 10}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"slot granted again before the lease can expire", []porcupine.Operation{grantA, grantB(50, 94)}, false},
		{"slot granted again once it may have expired", []porcupine.Operation{grantA, grantB(50, 95)}, true},
		{"refused while it may still be held", []porcupine.Operation{grantA, refused(100, 106)}, true},
		{"refused once it is gone", []porcupine.Operation{grantA, refused(107, 108)}, false},
		{"shown while it may still be held", []porcupine.Operation{grantA, status(105, 106, a)}, true},
		{"shown once it is gone", []porcupine.Operation{grantA, status(107, 108, a)}, false},
		{"not shown before it can expire", []porcupine.Operation{grantA, status(50, 60)}, false},
		{"lost before it can expire", []porcupine.Operation{grantA, releaseA(50, 60, resLeaseLost)}, false},
		{"lost once it may have expired", []porcupine.Operation{grantA, releaseA(90, 96, resLeaseLost)}, true},
		{"released while it may still be held", []porcupine.Operation{grantA, releaseA(100, 101, resOK)}, true},
		{"released once it is gone", []porcupine.Operation{grantA, releaseA(107, 108, resOK)}, false},
	}
	for _, c := range cases {
		h := linHistory{ops: c.ops, known: map[string]bool{"a": true, "b": true}, limit: 1, ttl: ttl}
		if got := porcupine.CheckOperations(linModel(h), h.ops); got != c.ok {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.ok)
		}
	}
}
