package property_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// The linearizability checker: several clients, each with its own
// *redis.Client (its own connections) and its own semaphore object, call
// TryAcquire, Lease.Release, Status and SetLimit concurrently on one
// semaphore name; the history of calls (with their start and end times) is
// checked with porcupine against the sequential model in linmodel_test.go.
// See docs/testing.md.

const (
	linTTL       = time.Minute // no lease expires within a history
	linCheckTime = 20 * time.Second
)

// linWorkload is what the clients of one history do.
type linWorkload struct {
	clients   int
	ops       int // per client
	limit     int // the limit every client is built with
	maxHeld   int // leases one client holds at most
	setLimits bool
	// shared: so many clients in a row share one semaphore object, as
	// callers of one process do (their releases may go together in one
	// call: core's releases.go); 0 or 1: each has its own.
	shared int
}

// linFaults, when set, puts a proxy that loses replies and resets
// connections between the clients and Redis.
type linFaults struct {
	drop, kill float64
	retries    int // go-redis MaxRetries of each client (-1: none)
}

// newSemFunc builds one client's semaphore, with leases of ttl that are not
// renewed automatically.
type newSemFunc func(c *redis.Client, name string, limit int, ttl time.Duration) (redsem.Semaphore, error)

func newUnfair(c *redis.Client, name string, limit int, ttl time.Duration) (redsem.Semaphore, error) {
	return unfair.New(c, name, limit, unfair.Options{LeaseTTL: ttl, DisableAutoRenew: true})
}

func newFair(c *redis.Client, name string, limit int, ttl time.Duration) (redsem.Semaphore, error) {
	return fair.New(c, name, limit, fair.Options{LeaseTTL: ttl, DisableAutoRenew: true})
}

// linHistory is a recorded history.
type linHistory struct {
	ops     []porcupine.Operation
	known   map[string]bool // ids that some TryAcquire returned
	limit   int
	ttl     time.Duration // the leases' TTL when they may expire within the history; 0: none does
	unknown int           // operations of unknown outcome
}

// unknownReturn marks an operation whose return is set to the end of the
// history once it is known.
const unknownReturn = -1

// linRecorder records the calls of several clients on one semaphore, with
// their call and return times (ns since the recorder was made). With
// faults set, a call that fails with an error outside the specification
// has an unknown outcome; without, it is a failure of the test, and the
// calling client stops.
type linRecorder struct {
	faults bool
	base   time.Time

	mu     sync.Mutex
	ops    []porcupine.Operation
	failed []error
}

func newLinRecorder(faults bool) *linRecorder {
	return &linRecorder{faults: faults, base: time.Now()}
}

func (r *linRecorder) now() int64 { return int64(time.Since(r.base)) }

func (r *linRecorder) record(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// unexpected decides what an error outside the specification means: with
// faults injected, an unknown outcome (true); without, a failure (false:
// the client stops).
func (r *linRecorder) unexpected(what string, err error) bool {
	if r.faults {
		return true
	}
	r.mu.Lock()
	r.failed = append(r.failed, fmt.Errorf("%s: %w", what, err))
	r.mu.Unlock()
	return false
}

// opCtx bounds one call.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// try records a TryAcquire of client ci; it returns the lease (nil unless
// granted) and false if the client must stop.
func (r *linRecorder) try(ci int, s redsem.Semaphore) (redsem.Lease, bool) {
	ctx, cancel := opCtx()
	defer cancel()
	call := r.now()
	l, err := s.TryAcquire(ctx)
	ret := r.now()
	out := linOut{}
	switch {
	case err == nil:
		out = linOut{res: resOK, id: l.ID(), slot: l.Slot(), token: l.Token()}
	case errors.Is(err, redsem.ErrNoSlot):
		out.res = resNoSlot
	default:
		if !r.unexpected("TryAcquire", err) {
			return nil, false
		}
		out.res, ret = resUnknown, unknownReturn
	}
	r.record(porcupine.Operation{ClientId: ci, Input: linIn{kind: opTry}, Call: call, Output: out, Return: ret})
	return l, true
}

// release records a Release of l by client ci.
func (r *linRecorder) release(ci int, l redsem.Lease) bool {
	ctx, cancel := opCtx()
	defer cancel()
	call := r.now()
	err := l.Release(ctx)
	ret := r.now()
	out := linOut{}
	switch {
	case err == nil:
		out.res = resOK
	case errors.Is(err, redsem.ErrLeaseLost):
		out.res = resLeaseLost
	default:
		if !r.unexpected("Release", err) {
			return false
		}
		out.res, ret = resUnknown, unknownReturn
	}
	r.record(porcupine.Operation{ClientId: ci, Input: linIn{kind: opRelease, id: l.ID()}, Call: call, Output: out, Return: ret})
	return true
}

// status records a Status of client ci (one that failed is left out: a
// read of unknown outcome changes nothing).
func (r *linRecorder) status(ci int, s redsem.Semaphore) bool {
	ctx, cancel := opCtx()
	defer cancel()
	call := r.now()
	st, err := s.Status(ctx)
	ret := r.now()
	if err != nil {
		return r.unexpected("Status", err)
	}
	r.record(porcupine.Operation{ClientId: ci, Input: linIn{kind: opStatus}, Call: call, Output: statusOut(st), Return: ret})
	return true
}

func statusOut(st redsem.Status) linOut {
	out := linOut{res: resOK, limit: st.Limit, waiters: len(st.Waiters)}
	for _, h := range st.Holders {
		out.holders = append(out.holders, linHolder{id: h.ID, slot: h.Slot, token: h.Token})
	}
	slices.SortFunc(out.holders, func(a, b linHolder) int { return strings.Compare(a.id, b.id) })
	return out
}

// setLimit records a SetLimit(n) of client ci.
func (r *linRecorder) setLimit(ci int, s redsem.Semaphore, n int) bool {
	ctx, cancel := opCtx()
	defer cancel()
	call := r.now()
	err := s.SetLimit(ctx, n)
	ret := r.now()
	out := linOut{res: resOK}
	if err != nil {
		if !r.unexpected("SetLimit", err) {
			return false
		}
		out.res, ret = resUnknown, unknownReturn
	}
	r.record(porcupine.Operation{ClientId: ci, Input: linIn{kind: opSetLimit, limit: n}, Call: call, Output: out, Return: ret})
	return true
}

// random records one call of client ci drawn as workload w says: a
// TryAcquire (while it holds fewer than w.maxHeld leases), a Release of one
// of held, a Status, or (w.setLimits) a SetLimit. It reports false if the
// client must stop.
func (r *linRecorder) random(ci int, s redsem.Semaphore, w linWorkload, rng *rand.Rand, held *[]redsem.Lease) bool {
	x := rng.Float64()
	switch {
	case x < 0.45 && len(*held) < w.maxHeld:
		l, ok := r.try(ci, s)
		if l != nil {
			*held = append(*held, l)
		}
		return ok
	case x < 0.8 && len(*held) > 0:
		i := rng.IntN(len(*held))
		l := (*held)[i]
		*held = slices.Delete(*held, i, i+1)
		return r.release(ci, l)
	case x < 0.95 || !w.setLimits:
		return r.status(ci, s)
	default:
		return r.setLimit(ci, s, 1+rng.IntN(4))
	}
}

// history ends the recording with a quiescent Status through s, so that
// every grant of unknown outcome is seen by the model at least once, and
// returns the history: operations of unknown outcome return at its end.
// Leases of ttl (0: none expires within the history) were granted under
// limit.
func (r *linRecorder) history(t *testing.T, s redsem.Semaphore, limit int, ttl time.Duration) linHistory {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, err := range r.failed {
		t.Fatalf("a call failed with an error outside the specification (no fault injected): %v", err)
	}
	ctx, cancel := opCtx()
	defer cancel()
	call := r.now()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatalf("final Status: %v", err)
	}
	ops := append(r.ops, porcupine.Operation{ClientId: 0, Input: linIn{kind: opStatus}, Call: call, Output: statusOut(st), Return: r.now()})
	h := linHistory{known: map[string]bool{}, limit: limit, ttl: ttl}
	end := r.now() + 1
	for i := range ops {
		if ops[i].Return == unknownReturn {
			ops[i].Return = end // the effect may come at any time after the call, or never
			h.unknown++
		}
		in := ops[i].Input.(linIn)
		in.call, in.ret = ops[i].Call, ops[i].Return // for the model's expiry
		ops[i].Input = in
		if o := ops[i].Output.(linOut); in.kind == opTry && o.res == resOK {
			h.known[o.id] = true
		}
	}
	h.ops = ops
	return h
}

// recordHistory runs one workload against srv (through a faulty proxy when
// faults is set) and returns its history. wrap, if set, wraps every
// client's semaphore (the mutant self-test).
func recordHistory(t *testing.T, srv *redistest.Server, newSem newSemFunc, w linWorkload, faults *linFaults,
	wrap func(redsem.Semaphore) redsem.Semaphore) linHistory {
	t.Helper()
	name := redistest.Name(t) + fmt.Sprintf("-%08x", rand.Uint32())
	opt := srv.Options()
	var proxy *redistest.Proxy
	if faults != nil {
		proxy = redistest.StartProxy(t, srv.Addr)
		opt.Addr = proxy.Addr
		opt.MaxRetries = faults.retries
		opt.ReadTimeout = time.Second
		opt.WriteTimeout = time.Second
	}
	sems := make([]redsem.Semaphore, w.clients)
	for i := range sems {
		if w.shared > 1 && i%w.shared != 0 {
			sems[i] = sems[i-i%w.shared]
			continue
		}
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		s, err := newSem(c, name, w.limit, linTTL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if wrap != nil {
			s = wrap(s)
		}
		sems[i] = s
	}
	if proxy != nil {
		proxy.SetFaults(faults.drop, faults.kill)
	}

	rec := newLinRecorder(faults != nil)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		leftover []redsem.Lease // leases still held at the end, released after the history
	)
	for ci, s := range sems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(ci)))
			var held []redsem.Lease
			for range w.ops {
				if !rec.random(ci, s, w, rng, &held) {
					break
				}
			}
			mu.Lock()
			leftover = append(leftover, held...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if proxy != nil {
		proxy.SetFaults(0, 0)
		d, k := proxy.Faults()
		t.Logf("proxy lost %d replies and reset %d connections", d, k)
	}
	h := rec.history(t, sems[0], w.limit, 0)
	releaseAll(leftover)
	return h
}

// releaseAll releases the leases a history left held.
func releaseAll(leases []redsem.Lease) {
	ctx, cancel := opCtx()
	defer cancel()
	for _, l := range leases {
		_ = l.Release(ctx)
	}
}

// checkHistory checks h with porcupine. On a failure it returns a
// description: the operations that could not extend the longest
// linearization found, with the model's reason for each; and, when files
// is set or $REDSEM_LIN_DIR names a directory, it writes porcupine's
// visualisation and the history as text there (default os.TempDir()).
func checkHistory(t *testing.T, label string, h linHistory, files bool) (porcupine.CheckResult, string) {
	t.Helper()
	model := linModel(h)
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, linCheckTime)
	t.Logf("%s: %d operations (%d of unknown outcome), %v in %v", label, len(h.ops), h.unknown, res, time.Since(began).Round(time.Millisecond))
	if res == porcupine.Ok {
		return res, ""
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "%s: history of %d operations is %s", label, len(h.ops), map[porcupine.CheckResult]string{
		porcupine.Illegal: "not linearizable", porcupine.Unknown: "not decided within " + linCheckTime.String(),
	}[res])
	if res == porcupine.Illegal {
		msg.WriteString(explain(h, info))
	}
	dir := os.Getenv("REDSEM_LIN_DIR")
	if dir == "" {
		if !files {
			return res, msg.String()
		}
		dir = os.TempDir()
	}
	safe := strings.NewReplacer("/", "_", " ", "_").Replace(label)
	path := filepath.Join(dir, fmt.Sprintf("redsem-lin-%s-%d.html", safe, time.Now().UnixNano()))
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		fmt.Fprintf(&msg, "\n(visualisation not written: %v)", err)
	} else {
		fmt.Fprintf(&msg, "\nvisualisation: %s", path)
	}
	var text strings.Builder
	sorted := slices.Clone(h.ops)
	slices.SortFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	for _, op := range sorted {
		fmt.Fprintf(&text, "%12.3fms %12.3fms client %d  %s\n", float64(op.Call)/1e6, float64(op.Return)/1e6,
			op.ClientId, describeOp(op.Input, op.Output))
	}
	txt := strings.TrimSuffix(path, ".html") + ".txt"
	if err := os.WriteFile(txt, []byte(text.String()), 0o644); err == nil {
		fmt.Fprintf(&msg, "\nhistory (by call time): %s", txt)
	}
	return res, msg.String()
}

// explain replays the longest partial linearization porcupine found and
// tells why each operation that could come next cannot.
func explain(h linHistory, info porcupine.LinearizationInfo) string {
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	st := linState{limit: h.limit}
	done := map[int]bool{} // index in h.ops
	type key struct {
		client    int
		call, ret int64
	}
	index := map[key]int{}
	for i, op := range h.ops {
		index[key{op.ClientId, op.Call, op.Return}] = i
	}
	for _, op := range longest {
		st, _ = specOf(h).step(st, op.Input.(linIn), op.Output.(linOut))
		done[index[key{op.ClientId, op.Call, op.Return}]] = true
	}
	// The operations that may come next: not linearized, and called before
	// every other pending operation returned.
	minRet := int64(1<<63 - 1)
	for i, op := range h.ops {
		if !done[i] {
			minRet = min(minRet, op.Return)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nlongest linearization: %d operations, ending in state {%s}; none of these can come next:", len(longest), describeState(st))
	n := 0
	for i, op := range h.ops {
		if done[i] || op.Call > minRet {
			continue
		}
		_, reason := specOf(h).step(st, op.Input.(linIn), op.Output.(linOut))
		if reason == "" {
			continue // can step, but then the rest cannot
		}
		if n++; n > 6 {
			b.WriteString("\n  ...")
			break
		}
		fmt.Fprintf(&b, "\n  client %d, %s: %s", op.ClientId, describeOp(op.Input, op.Output), reason)
	}
	return b.String()
}

// linVariants are the semaphores checked.
var linVariants = []struct {
	name   string
	newSem newSemFunc
}{{"unfair", newUnfair}, {"fair", newFair}}

// TestLinearizable checks histories of both variants without faults: the
// model is then exact.
func TestLinearizable(t *testing.T) {
	srv := redistest.Start(t)
	workloads := []linWorkload{
		{clients: 4, ops: 100, limit: 2, maxHeld: 2, setLimits: true},
		{clients: 5, ops: 80, limit: 3, maxHeld: 1, setLimits: true},
		{clients: 3, ops: 100, limit: 1, maxHeld: 1, setLimits: false},
		{clients: 6, ops: 80, limit: 4, maxHeld: 2, shared: 3},
	}
	rounds := 5
	if soak() {
		rounds = 20
	}
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			for r := range rounds {
				for wi, w := range workloads {
					h := recordHistory(t, srv, v.newSem, w, nil, nil)
					if res, msg := checkHistory(t, fmt.Sprintf("%s-w%d-r%d", v.name, wi, r), h, true); res != porcupine.Ok {
						t.Error(msg)
					}
				}
			}
		})
	}
}

// TestLinearizableNetworkFaults checks histories made through a proxy that
// loses replies after Redis ran the request and resets connections: with
// go-redis's retries off, every fault is an error and the call's outcome is
// unknown; with retries on, most faults are hidden and scripts re-run, so
// each call must be idempotent under a re-send. SetLimit is left out of the
// retried histories: see TestLinearizableRetriedSetLimit.
func TestLinearizableNetworkFaults(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		faults linFaults
		w      linWorkload
	}{
		{linFaults{drop: 0.04, kill: 0.02, retries: -1}, linWorkload{clients: 4, ops: 80, limit: 2, maxHeld: 2, setLimits: true}},
		{linFaults{drop: 0.08, kill: 0.04, retries: 3}, linWorkload{clients: 4, ops: 80, limit: 2, maxHeld: 2}},
		{linFaults{drop: 0.08, kill: 0.04, retries: 3}, linWorkload{clients: 8, ops: 40, limit: 4, maxHeld: 2, shared: 4}},
	}
	rounds := 3
	if soak() {
		rounds = 30
	}
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			for r := range rounds {
				for ci, c := range cases {
					h := recordHistory(t, srv, v.newSem, c.w, &c.faults, nil)
					if res, msg := checkHistory(t, fmt.Sprintf("%s-faults%d-r%d", v.name, ci, r), h, true); res != porcupine.Ok {
						t.Error(msg)
					}
				}
			}
		})
	}
}

// TestLinearizableRetriedSetLimit is TestLinearizableNetworkFaults's retried
// histories with SetLimit calls. It found a lost update: when the reply to
// a SetLimit was lost, go-redis sent it again, and the second copy could
// land after another client's later SetLimit and undo it (seen: a
// SetLimit(4) applied at 710 ms and again at 1085 ms, reverting a
// SetLimit(1) made at 907 ms in between; a grant with 1 of 1 slots held
// followed). SetLimit now carries a call id that setlimit.lua records, so a
// re-sent copy changes nothing. The root package's
// TestResentSetLimitDoesNotUndoLaterSetLimit is its deterministic form.
func TestLinearizableRetriedSetLimit(t *testing.T) {
	srv := redistest.Start(t)
	faults := linFaults{drop: 0.08, kill: 0.04, retries: 3}
	w := linWorkload{clients: 4, ops: 80, limit: 2, maxHeld: 2, setLimits: true}
	for _, v := range linVariants {
		t.Run(v.name, func(t *testing.T) {
			for r := range 5 {
				h := recordHistory(t, srv, v.newSem, w, &faults, nil)
				if res, msg := checkHistory(t, fmt.Sprintf("%s-retried-setlimit-r%d", v.name, r), h, true); res != porcupine.Ok {
					t.Error(msg)
				}
			}
		})
	}
}
