package redistest

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxDelay bounds every hold a Delayer puts on a reply or a read: a
// configured or chosen delay above it is cut to it.
const MaxDelay = 100 * time.Millisecond

// Delayer is a fault layer for go-redis clients that only ever delays: it
// never loses, reorders within a connection, or changes a byte. Installed
// on a client (AddHook, or NewClient), it
//
//   - holds back the reply of a command after Redis executed it (the
//     command ran, its reply reaches the caller late): at random, for the
//     commands DelayConfig.Replies matches, with DelayConfig.ReplyOdds; or
//     one chosen reply, with HoldNext;
//   - holds back what a connection reads from Redis: every pub/sub
//     connection (one that sent SUBSCRIBE, SSUBSCRIBE or PSUBSCRIBE), and
//     a share of the others (DelayConfig.SlowConnOdds, drawn per
//     connection), with DelayConfig.ReadOdds per read; or everything the
//     pub/sub connections receive for a chosen time, with HoldPubSub. go-redis
//     has no hook for received pub/sub messages, so this happens in the
//     connection itself (DialHook): a message reaches the subscriber late,
//     after replies that Redis sent later on other connections.
//
// The random holds apply while the Delayer is on (SetOn; it starts on) and
// are drawn from a generator seeded with DelayConfig.Seed; the chosen ones
// (HoldNext, HoldPubSub) apply whether it is on or off. A hold ends early
// when the caller's context ends (the reply is then delivered as it is, not
// lost). Goroutine scheduling still varies between runs, so a seed makes
// the delays, not the interleavings, repeatable.
type Delayer struct {
	cfg DelayConfig
	on  atomic.Bool

	mu     sync.Mutex
	rng    *rand.Rand // under mu
	forced []forcedHold
	psTill time.Time // HoldPubSub: pub/sub reads before this wait until it

	heldReplies atomic.Int64
	heldReads   atomic.Int64
	pubsubConns atomic.Int64
	slowConns   atomic.Int64
}

// DelayConfig says what a Delayer delays and by how much.
type DelayConfig struct {
	// Seed seeds the generator of the random holds (e.g. a value drawn by
	// rapid, so that a failing case replays with the same delays).
	Seed uint64
	// Replies selects the commands whose replies may be held at random;
	// nil selects every command. See MatchCommands, MatchScripts and
	// MatchScript.
	Replies Match
	// ReplyOdds is the chance, in [0, 1], that a selected reply is held.
	ReplyOdds float64
	// ReadOdds is the chance, in [0, 1], that one read (a chunk of bytes,
	// one or more replies or pub/sub messages) on a held connection is
	// held before the caller sees it. Every pub/sub connection is held.
	ReadOdds float64
	// SlowConnOdds is the chance, in [0, 1], that a new connection that is
	// not (yet) a pub/sub one is held as well, decided once when it is
	// dialled: its replies then come late as if its network were slow.
	SlowConnOdds float64
	// Min and Max bound a random hold; Max is cut to MaxDelay, and a Max
	// of zero means MaxDelay/4.
	Min, Max time.Duration
}

// Match selects commands by their name and arguments.
type Match func(cmd redis.Cmder) bool

// MatchCommands selects the commands of the given names (any case).
func MatchCommands(names ...string) Match {
	set := map[string]bool{}
	for _, n := range names {
		set[strings.ToLower(n)] = true
	}
	return func(cmd redis.Cmder) bool { return set[strings.ToLower(cmd.Name())] }
}

// MatchScripts selects every script or function call: EVAL, EVALSHA,
// FCALL and their read-only forms.
func MatchScripts() Match {
	return MatchCommands("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
}

// MatchScript selects the calls of one script however they are made:
// EVALSHA (or EVALSHA_RO) of sha, EVAL (or EVAL_RO) of a body whose SHA-1
// is sha, or FCALL (or FCALL_RO) of function (when not empty).
func MatchScript(sha, function string) Match {
	sha = strings.ToLower(sha)
	return func(cmd redis.Cmder) bool {
		args := cmd.Args()
		if len(args) < 2 {
			return false
		}
		a, _ := args[1].(string)
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "evalsha_ro":
			return strings.ToLower(a) == sha
		case "eval", "eval_ro":
			sum := sha1.Sum([]byte(a))
			return hex.EncodeToString(sum[:]) == sha
		case "fcall", "fcall_ro":
			return function != "" && a == function
		}
		return false
	}
}

type forcedHold struct {
	match Match
	d     time.Duration
}

// NewDelayer returns a Delayer, on, with the given configuration. Install
// it on a client with client.AddHook(d) before the client's first
// connection (or use NewClient): connections dialled before are not held.
func NewDelayer(cfg DelayConfig) *Delayer {
	if cfg.Max <= 0 {
		cfg.Max = MaxDelay / 4
	}
	cfg.Max = min(cfg.Max, MaxDelay)
	cfg.Min = max(min(cfg.Min, cfg.Max), 0)
	d := &Delayer{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	d.on.Store(true)
	return d
}

// NewClient returns a client for opt with d installed.
func (d *Delayer) NewClient(opt *redis.Options) *redis.Client {
	c := redis.NewClient(opt)
	c.AddHook(d)
	return c
}

// HoldingClient returns a client of the shared server, closed when the
// test ends, with a Delayer installed that holds nothing by itself (off):
// only what the test asks for (HoldNext, HoldPubSub).
func HoldingClient(t testing.TB) (*redis.Client, *Delayer) {
	t.Helper()
	d := NewDelayer(DelayConfig{})
	d.SetOn(false)
	return closeAtEnd(t, d.NewClient(Shared(t).Options())), d
}

// SetOn turns the random holds on or off at once (a machine's "calm" and
// "stormy" stretches). Holds already running end as drawn; HoldNext and
// HoldPubSub apply either way.
func (d *Delayer) SetOn(on bool) { d.on.Store(on) }

// On reports whether the random holds are on.
func (d *Delayer) On() bool { return d.on.Load() }

// HoldNext holds the reply of the next command that m selects (after Redis
// ran it) for delay (at most MaxDelay), on or off. Several calls queue up;
// each holds one reply.
func (d *Delayer) HoldNext(m Match, delay time.Duration) {
	d.mu.Lock()
	d.forced = append(d.forced, forcedHold{m, min(delay, MaxDelay)})
	d.mu.Unlock()
}

// DropHolds forgets the HoldNext holds not used yet.
func (d *Delayer) DropHolds() {
	d.mu.Lock()
	d.forced = nil
	d.mu.Unlock()
}

// HoldPubSub holds everything that the pub/sub connections read from now
// until delay (at most MaxDelay) has passed: it reaches the subscribers
// then, in order, on or off.
func (d *Delayer) HoldPubSub(delay time.Duration) {
	d.mu.Lock()
	d.psTill = time.Now().Add(min(delay, MaxDelay))
	d.mu.Unlock()
}

// DelayStats counts what a Delayer did.
type DelayStats struct {
	HeldReplies int64 // replies (or pipelines) held
	HeldReads   int64 // connection reads held
	PubSubConns int64 // connections seen to subscribe
	SlowConns   int64 // other connections drawn to be held
}

// Stats returns the counts so far.
func (d *Delayer) Stats() DelayStats {
	return DelayStats{d.heldReplies.Load(), d.heldReads.Load(), d.pubsubConns.Load(), d.slowConns.Load()}
}

// draw returns a random hold in [Min, Max] with odds p while on, else 0.
func (d *Delayer) draw(p float64) time.Duration {
	if p <= 0 || !d.on.Load() {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rng.Float64() >= p {
		return 0
	}
	return d.cfg.Min + time.Duration(d.rng.Int64N(int64(d.cfg.Max-d.cfg.Min)+1))
}

// replyHold is the hold of the reply of cmds: a chosen one if a HoldNext
// selects one of them, else a random one if the configuration selects one.
func (d *Delayer) replyHold(cmds ...redis.Cmder) time.Duration {
	d.mu.Lock()
	for i, f := range d.forced {
		for _, c := range cmds {
			if f.match(c) {
				d.forced = append(d.forced[:i:i], d.forced[i+1:]...)
				d.mu.Unlock()
				return f.d
			}
		}
	}
	d.mu.Unlock()
	for _, c := range cmds {
		if d.cfg.Replies == nil || d.cfg.Replies(c) {
			return d.draw(d.cfg.ReplyOdds)
		}
	}
	return 0
}

// answered reports whether err means that Redis answered (a reply or an
// error reply): only then is there a reply to hold.
func answered(err error) bool {
	var re redis.Error
	return err == nil || errors.Is(err, redis.Nil) || errors.As(err, &re)
}

// hold sleeps for delay or until ctx ends.
func hold(ctx context.Context, delay time.Duration) {
	if delay <= 0 {
		return
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// DialHook wraps every new connection of the client (commands and pub/sub)
// so that its reads can be held.
func (d *Delayer) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dc := &delayConn{Conn: c, d: d}
		if p := d.cfg.SlowConnOdds; p > 0 {
			d.mu.Lock()
			slow := d.rng.Float64() < p
			d.mu.Unlock()
			if slow {
				dc.held.Store(true)
				d.slowConns.Add(1)
			}
		}
		return dc, nil
	}
}

// ProcessHook holds a command's reply after Redis answered it.
func (d *Delayer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if answered(err) {
			if h := d.replyHold(cmd); h > 0 {
				d.heldReplies.Add(1)
				hold(ctx, h)
			}
		}
		return err
	}
}

// ProcessPipelineHook holds a pipeline's replies (all of them together)
// after Redis answered them, when one of its commands is selected.
func (d *Delayer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if answered(err) {
			if h := d.replyHold(cmds...); h > 0 {
				d.heldReplies.Add(1)
				hold(ctx, h)
			}
		}
		return err
	}
}

// delayConn is a connection whose reads may be held: a read that returned
// data sleeps before it returns it, so that the data reaches the reader
// late; bytes that arrive meanwhile wait in the socket for the next read
// (which may be held again: data is held at most twice Max). Nothing is
// buffered here, so nothing can be lost or reordered.
type delayConn struct {
	net.Conn
	d      *Delayer
	held   atomic.Bool // a pub/sub connection, or drawn slow at dial
	pubsub atomic.Bool
}

func (c *delayConn) Write(p []byte) (int, error) {
	if !c.pubsub.Load() && subscribes(p) {
		c.pubsub.Store(true)
		c.held.Store(true)
		c.d.pubsubConns.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *delayConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	var h time.Duration
	if c.pubsub.Load() {
		c.d.mu.Lock()
		if till := c.d.psTill; !till.IsZero() {
			h = time.Until(till)
		}
		c.d.mu.Unlock()
	}
	if h <= 0 && c.held.Load() {
		h = c.d.draw(c.d.cfg.ReadOdds)
	}
	if h > 0 {
		c.d.heldReads.Add(1)
		time.Sleep(h)
	}
	return n, err
}

// subscribes reports whether the commands written in p (RESP arrays of
// bulk strings, as go-redis writes them) include SUBSCRIBE, SSUBSCRIBE or
// PSUBSCRIBE. A write it cannot parse does not count.
func subscribes(p []byte) bool {
	for len(p) > 0 {
		name, rest, ok := firstArg(p)
		if !ok {
			return false
		}
		switch strings.ToLower(name) {
		case "subscribe", "ssubscribe", "psubscribe":
			return true
		}
		p = rest
	}
	return false
}

// firstArg parses one RESP array of bulk strings at the start of p and
// returns its first element and what follows the array.
func firstArg(p []byte) (name string, rest []byte, ok bool) {
	line := func(b []byte, kind byte) (int, []byte, bool) {
		if len(b) == 0 || b[0] != kind {
			return 0, nil, false
		}
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return 0, nil, false
		}
		v, err := strconv.Atoi(string(b[1:i]))
		if err != nil || v < 0 {
			return 0, nil, false
		}
		return v, b[i+2:], true
	}
	count, b, ok := line(p, '*')
	if !ok || count == 0 {
		return "", nil, false
	}
	for i := 0; i < count; i++ {
		var size int
		if size, b, ok = line(b, '$'); !ok || len(b) < size+2 {
			return "", nil, false
		}
		if i == 0 {
			name = string(b[:size])
		}
		b = b[size+2:]
	}
	return name, b, true
}
