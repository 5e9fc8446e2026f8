package property_test

// The rate-window machines: rapid state machines for the rate's window
// alone, with a small model of their own, in states the other machines do
// not reach: a period (3 s) that outlives every lease (100 ms, never
// renewed) by more than a semaphore's keys live without a rate, idle
// stretches in which every lease expires and those keys would go, and
// weighted grants spread over the window (quiet gaps between them, waits
// until the oldest leaves). The model is the list of grants (token = the
// server µs the window records, weight); after every TryAcquireN it knows,
// from the server's clock read just before and after the call, whether the
// window had room, and, for a refusal, what RetryAfter must be: the token
// of the grant whose leaving makes room for the n slots, plus the period,
// from the script's clock, rounded up to whole ms. Status's RateGranted is
// checked the same way. The deterministic forms of these checks are
// lua/ratewindow_test.go and ratewindow_test.go.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
	"pgregory.net/rapid"
)

const (
	// rwmPer: the rate's period. It must outlive the keys of a semaphore
	// without a rate (about 2 s after its last grant) by the time the
	// checks after an idle stretch take, so that the window still holds
	// grants then.
	rwmPer      = 3 * time.Second
	rwmLeaseTTL = 100 * time.Millisecond
	rwmMaxIdles = 2 // idle stretches per check (each about 2 s)
	rwmMaxEdges = 1 // waits for the oldest grant to leave, per check (up to rwmPer)
	rwmBound    = 10 * time.Second
)

// rwmActions: drawn uniformly, so repeated names weigh more. Shrinking
// goes towards "try".
var rwmActions = []string{"try", "try", "try", "gap", "gap", "probe", "idle", "idle", "edge"}

func rwmBudget() (checks, minSteps, maxSteps int) {
	if soak() {
		return 15, 8, 16
	}
	return 3, 8, 12
}

func TestUnfairRateWindowMachine(t *testing.T) { runRateWindow(t, false) }
func TestFairRateWindowMachine(t *testing.T)   { runRateWindow(t, true) }

func runRateWindow(t *testing.T, isFair bool) {
	checks, minSteps, maxSteps := rwmBudget()
	if !userChecks {
		old := flag.Lookup("rapid.checks").Value.String()
		_ = flag.Set("rapid.checks", strconv.Itoa(checks))
		defer func() { _ = flag.Set("rapid.checks", old) }()
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	n, began := 0, time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		n++
		trace("%s: check %d at %.1fs", t.Name(), n, time.Since(began).Seconds())
		m := newRWMachine(t, rt, rdb, isFair)
		defer m.stop()
		steps := rapid.IntRange(minSteps, maxSteps).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch a := rapid.SampledFrom(rwmActions).Draw(rt, "action"); a {
			case "try":
				m.try(rt, rapid.IntRange(1, m.rate.Limit).Draw(rt, "n"))
			case "gap":
				m.gap(rt)
			case "probe":
				m.probe(rt)
			case "idle":
				m.idle(rt)
			case "edge":
				m.edge(rt)
			}
			m.check(rt)
		}
	})
}

// rwmGrant is one grant of the rated semaphore: its token (the score of
// its window record, server µs) and its weight.
type rwmGrant struct {
	token int64
	n     int
}

type rwMachine struct {
	rdb  *redis.Client
	rate redsem.Rate
	// sem has the rate; twin has none and the same leases, and takes a
	// grant of the same weight right after each of sem's: its keys go
	// when a semaphore's would without a rate (the idle stretch waits for
	// that).
	sem, twin redsem.Semaphore
	twinKeys  core.Keys
	grants    []rwmGrant // every grant of sem, in token order
	idles     int
	edges     int
}

func newRWMachine(t *testing.T, rt *rapid.T, rdb *redis.Client, isFair bool) *rwMachine {
	name := redistest.Name(t)
	m := &rwMachine{rdb: rdb, twinKeys: core.KeysFor(core.DefaultPrefix, name+"-twin")}
	m.rate = redsem.Rate{Limit: rapid.IntRange(2, 5).Draw(rt, "rate_limit"), Per: rwmPer}
	// Twice the rate's limit in slots: leases live less than the period,
	// so the slots held never exceed the window's grants, and slots never
	// refuse what the rate lets in (acquire.lua reports the rate only with
	// the slots free).
	limit := 2 * m.rate.Limit
	mk := func(name string, limit int, rate redsem.Rate) redsem.Semaphore {
		var s redsem.Semaphore
		var err error
		if isFair {
			s, err = fair.New(rdb, name, limit, fair.Options{Rate: rate, LeaseTTL: rwmLeaseTTL, DisableAutoRenew: true})
		} else {
			s, err = unfair.New(rdb, name, limit, unfair.Options{Rate: rate, LeaseTTL: rwmLeaseTTL, DisableAutoRenew: true})
		}
		if err != nil {
			fatalf(rt, "new %s: %v", name, err)
		}
		return s
	}
	m.sem = mk(name, limit, m.rate)
	m.twin = mk(name+"-twin", 1000, redsem.Rate{})
	return m
}

func (m *rwMachine) stop() {
	_ = m.sem.Close()
	_ = m.twin.Close()
}

func (m *rwMachine) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rwmBound)
}

func (m *rwMachine) serverUs(rt *rapid.T) int64 {
	ctx, cancel := m.ctx()
	defer cancel()
	now, err := m.rdb.Time(ctx).Result()
	if err != nil {
		fatalf(rt, "TIME: %v", err)
	}
	return now.UnixMicro()
}

// waitServerUs waits until the server's clock reaches us (bounded).
func (m *rwMachine) waitServerUs(rt *rapid.T, us int64) {
	deadline := time.Now().Add(rwmBound)
	for m.serverUs(rt) < us {
		if time.Now().After(deadline) {
			fatalf(rt, "the server clock did not reach %d µs within %v", us, rwmBound)
		}
		time.Sleep(time.Millisecond)
	}
}

// inWindow is the grants that the window holds at server µs u: those with
// a token above u - Per, oldest first, and their slots.
func (m *rwMachine) inWindow(u int64) ([]rwmGrant, int) {
	var in []rwmGrant
	sum := 0
	for _, g := range m.grants {
		if g.token > u-m.rate.Per.Microseconds() {
			in = append(in, g)
			sum += g.n
		}
	}
	return in, sum
}

// rwmSpan is a stretch [from, to] of server µs in which the window holds
// the same grants: sum slots, and n more slots fit, or do not until room
// (µs).
type rwmSpan struct {
	from, to int64
	sum      int
	fits     bool
	room     int64
}

// rwmCeilMs is us as whole ms rounded up, never below 0 (acquire.lua's
// rate_ms).
func rwmCeilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

// retryAfter is the range of RetryAfter a refusal in s may carry.
func (s rwmSpan) retryAfter() (lo, hi time.Duration) {
	return time.Duration(rwmCeilMs(s.room-s.to)) * time.Millisecond, time.Duration(rwmCeilMs(s.room-s.from)) * time.Millisecond
}

// spans splits [t1, t2] where grants leave the window, and says for each
// stretch whether n more slots fit and, if not, when they will: when the
// grant whose leaving makes room for them leaves.
func (m *rwMachine) spans(n int, t1, t2 int64) []rwmSpan {
	per := m.rate.Per.Microseconds()
	cuts := []int64{t1}
	for _, g := range m.grants {
		if e := g.token + per; e > t1 && e <= t2 {
			cuts = append(cuts, e)
		}
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i] < cuts[j] })
	var out []rwmSpan
	for i, from := range cuts {
		to := t2
		if i+1 < len(cuts) {
			to = cuts[i+1] - 1
		}
		if to < from {
			continue
		}
		in, sum := m.inWindow(from)
		s := rwmSpan{from: from, to: to, sum: sum, fits: sum+n <= m.rate.Limit}
		if !s.fits {
			need, acc := sum+n-m.rate.Limit, 0
			for _, g := range in {
				acc += g.n
				if acc >= need {
					s.room = g.token + per
					break
				}
			}
		}
		out = append(out, s)
	}
	return out
}

func (m *rwMachine) describe(u int64) string {
	in, sum := m.inWindow(u)
	var parts []string
	for _, g := range in {
		parts = append(parts, fmt.Sprintf("%d@%d", g.n, g.token))
	}
	return fmt.Sprintf("%d slots [%s] of rate %v", sum, strings.Join(parts, " "), m.rate)
}

// try: one TryAcquireN(n) on the rated semaphore, checked against the
// model; a grant is recorded, and mirrored on the twin.
func (m *rwMachine) try(rt *rapid.T, n int) {
	ctx, cancel := m.ctx()
	defer cancel()
	t1 := m.serverUs(rt)
	l, err := m.sem.TryAcquireN(ctx, n)
	t2 := m.serverUs(rt)
	spans := m.spans(n, t1, t2)
	var mayFit, mayRefuse bool
	for _, s := range spans {
		mayFit = mayFit || s.fits
		mayRefuse = mayRefuse || !s.fits
	}
	var rl *redsem.RateLimitedError
	switch {
	case err == nil:
		if !mayFit {
			fatalf(rt, "TryAcquireN(%d) granted (token %d) between server µs %d and %d, while the window held %s", n, l.Token(), t1, t2, m.describe(t1))
		}
		token := l.Token()
		if token < t1 || (len(m.grants) > 0 && token <= m.grants[len(m.grants)-1].token) {
			fatalf(rt, "TryAcquireN(%d) granted token %d: below the server clock %d or the last grant's", n, token, t1)
		}
		m.grants = append(m.grants, rwmGrant{token: token, n: n})
		rt.Logf("TryAcquireN(%d): granted, token %d", n, token)
		if _, err := m.twin.TryAcquireN(ctx, n); err != nil {
			fatalf(rt, "twin TryAcquireN(%d): %v", n, err)
		}
	case errors.As(err, &rl):
		if !mayRefuse {
			fatalf(rt, "TryAcquireN(%d) refused by the rate between server µs %d and %d, while the window had room: it held %s", n, t1, t2, m.describe(t1))
		}
		if rl.Rate != m.rate || !errors.Is(err, redsem.ErrRateLimited) {
			fatalf(rt, "TryAcquireN(%d): %v (rate %v), want a RateLimitedError for %v", n, err, rl.Rate, m.rate)
		}
		var want []string
		ok := false
		for _, s := range spans {
			if s.fits {
				continue
			}
			lo, hi := s.retryAfter()
			ok = ok || (rl.RetryAfter >= lo && rl.RetryAfter <= hi)
			want = append(want, fmt.Sprintf("%v..%v (room at %d µs)", lo, hi, s.room))
		}
		if !ok {
			fatalf(rt, "TryAcquireN(%d) between server µs %d and %d: RetryAfter %v, want %s: the window held %s",
				n, t1, t2, rl.RetryAfter, strings.Join(want, " or "), m.describe(t1))
		}
		rt.Logf("TryAcquireN(%d): rate limited, RetryAfter %v", n, rl.RetryAfter)
	default:
		fatalf(rt, "TryAcquireN(%d): %v, want a grant or a RateLimitedError", n, err)
	}
}

// gap: a quiet stretch of 5, 40 or 150 ms by the server's clock, so that
// grants lie apart in the window (a wake time one grant off is off by it).
func (m *rwMachine) gap(rt *rapid.T) {
	d := rapid.SampledFrom([]int64{5, 40, 150}).Draw(rt, "gap_ms")
	m.waitServerUs(rt, m.serverUs(rt)+d*1000)
}

// probe: a TryAcquireN of every size from 1 to the rate's limit in turn:
// while the window is full, each is refused, and wakes when the grant whose
// leaving makes room for it leaves, which differs by size when the window
// holds grants of several weights.
func (m *rwMachine) probe(rt *rapid.T) {
	for n := 1; n <= m.rate.Limit; n++ {
		m.try(rt, n)
	}
}

// idle: nothing happens until the twin's keys are gone: every lease has
// expired, and a semaphore without a rate would have let its keys go;
// then a TryAcquireN of the rate's limit, which the window refuses while
// it holds any grant.
func (m *rwMachine) idle(rt *rapid.T) {
	if m.idles >= rwmMaxIdles {
		return
	}
	if _, sum := m.inWindow(m.serverUs(rt)); sum == 0 {
		return // nothing that could outlive the keys
	}
	m.idles++
	ctx, cancel := m.ctx()
	defer cancel()
	deadline := time.Now().Add(rwmBound)
	for {
		n, err := m.rdb.Exists(ctx, m.twinKeys.List...).Result()
		if err != nil {
			fatalf(rt, "EXISTS: %v", err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			fatalf(rt, "the twin's keys still exist after %v", rwmBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rt.Logf("idle until the twin's keys went; the window holds %s", m.describe(m.serverUs(rt)))
	m.try(rt, m.rate.Limit)
}

// edge: waits until the oldest grant in the window leaves it (by the
// server's clock), then a TryAcquireN.
func (m *rwMachine) edge(rt *rapid.T) {
	if m.edges >= rwmMaxEdges {
		return
	}
	in, _ := m.inWindow(m.serverUs(rt))
	if len(in) == 0 {
		return
	}
	m.edges++
	m.waitServerUs(rt, in[0].token+m.rate.Per.Microseconds())
	m.try(rt, rapid.IntRange(1, m.rate.Limit).Draw(rt, "edge_n"))
}

// check: Status reports the rate, the slots granted in the window (what
// the model's grants say at some instant of the call), no waiter, and
// only holders that the model knows, with their weights.
func (m *rwMachine) check(rt *rapid.T) {
	ctx, cancel := m.ctx()
	defer cancel()
	t1 := m.serverUs(rt)
	st, err := m.sem.Status(ctx)
	t2 := m.serverUs(rt)
	if err != nil {
		fatalf(rt, "Status: %v", err)
	}
	if st.Rate != m.rate || len(st.Waiters) != 0 {
		fatalf(rt, "Status: rate %v, %d waiters; want %v, none", st.Rate, len(st.Waiters), m.rate)
	}
	var sums []string
	ok := false
	for _, s := range m.spans(1, t1, t2) {
		ok = ok || st.RateGranted == s.sum
		sums = append(sums, strconv.Itoa(s.sum))
	}
	if !ok {
		fatalf(rt, "Status between server µs %d and %d: %d granted in the window, want %s: it held %s", t1, t2, st.RateGranted, strings.Join(sums, " or "), m.describe(t1))
	}
	for _, h := range st.Holders {
		known := false
		for _, g := range m.grants {
			known = known || (g.token == h.Token && g.n == len(h.Slots))
		}
		if !known {
			fatalf(rt, "Status lists holder %s (token %d, slots %v) that the model does not know", h.ID, h.Token, h.Slots)
		}
	}
}
