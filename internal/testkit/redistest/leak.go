package redistest

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The goroutine-leak check reads runtime.Stack's dump of every goroutine.
// It is written here rather than taken from a library because this package
// is in the root module, whose every requirement, tests' included, enters
// the module graph of each user of fair and unfair (docs/design.md#modules).

// leakWait is how long a leak check waits for goroutines to end before it
// reports them: goroutines that a Close told to stop may take a moment.
const leakWait = 2 * time.Second

// A LeakOption leaves goroutines out of a leak check.
type LeakOption func(*leakCheck)

type leakCheck struct {
	ignoreIDs   map[int]bool
	ignoreFuncs []string
	wait        time.Duration
}

// IgnoreFunction leaves out every goroutine with function fn anywhere in its
// stack, fn named as in a stack trace, e.g.
// "github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial".
func IgnoreFunction(fn string) LeakOption {
	return func(c *leakCheck) { c.ignoreFuncs = append(c.ignoreFuncs, fn) }
}

// IgnoreCurrent leaves out the goroutines running when it is called.
func IgnoreCurrent() LeakOption {
	ids := map[int]bool{}
	for _, g := range goroutines() {
		ids[g.id] = true
	}
	return func(c *leakCheck) {
		for id := range ids {
			c.ignoreIDs[id] = true
		}
	}
}

// defaultIgnored are functions of goroutines that a test binary may run
// that are not a test's: the test runner's, signal handling's and tracing's.
var defaultIgnored = []string{
	"testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel",
	"os/signal.signal_recv", "os/signal.loop", "runtime.ensureSigM",
	"runtime.ReadTrace", "runtime/trace.Start.func1",
}

// MainNoLeaks is Main followed by a goroutine-leak check: when the tests
// passed, any goroutine still running after the shared server stopped (and
// not left out by opts, e.g. IgnoreFunction for a known long-lived one)
// fails the test binary with the goroutines' stacks. Use it from TestMain:
// func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }.
func MainNoLeaks(m *testing.M, opts ...LeakOption) int {
	code := Main(m)
	if code != 0 {
		return code
	}
	if leaked := findLeaks(opts); leaked != "" {
		fmt.Fprintf(os.Stderr, "redistest: goroutines left running after the tests:\n\n%s\n", leaked)
		return 1
	}
	return code
}

// CheckLeaks fails t if goroutines started from now on are still running
// after t's cleanups. Call it first in the test, so that its own cleanup
// runs last.
func CheckLeaks(t testing.TB, opts ...LeakOption) {
	t.Helper()
	opts = append(opts, IgnoreCurrent())
	t.Cleanup(func() {
		if leaked := findLeaks(opts); leaked != "" {
			t.Errorf("goroutines left running after the test:\n\n%s", leaked)
		}
	})
}

// findLeaks returns the stacks of the goroutines, other than the caller and
// those left out, that are still running after the check's wait; "" if none.
func findLeaks(opts []LeakOption) string {
	c := &leakCheck{ignoreIDs: map[int]bool{}, ignoreFuncs: defaultIgnored, wait: leakWait}
	for _, o := range opts {
		o(c)
	}
	deadline := time.Now().Add(c.wait)
	for {
		var leaked []string
		for _, g := range goroutines()[1:] { // the first is the caller's
			if !c.ignored(g) {
				leaked = append(leaked, g.stack)
			}
		}
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *leakCheck) ignored(g goroutine) bool {
	if c.ignoreIDs[g.id] {
		return true
	}
	runtimeOnly := true // the runtime's own, listed under GOTRACEBACK=system
	for _, fn := range g.funcs {
		for _, ig := range c.ignoreFuncs {
			if fn == ig {
				return true
			}
		}
		runtimeOnly = runtimeOnly && strings.HasPrefix(fn, "runtime.")
	}
	return runtimeOnly
}

// goroutine is one goroutine of a stack dump.
type goroutine struct {
	id    int
	funcs []string // the functions of its frames, innermost first
	stack string   // its part of the dump
}

// goroutines returns every goroutine's stack, the caller's first (as
// runtime.Stack lists them).
func goroutines() []goroutine {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, block := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
		header, frames, _ := strings.Cut(block, "\n")
		// "goroutine 7 [chan receive]:" (or "[chan receive, 2 minutes]:")
		fields := strings.Fields(header)
		if len(fields) < 2 || fields[0] != "goroutine" {
			continue
		}
		id, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		g := goroutine{id: id, stack: block}
		for _, line := range strings.Split(frames, "\n") {
			// A frame is "pkg.Func(args)" then "\tfile:line +0x.."; also
			// "created by pkg.Func in goroutine 1", which is not a frame.
			if line == "" || line[0] == '\t' || strings.HasPrefix(line, "created by ") {
				continue
			}
			if i := strings.LastIndexByte(line, '('); i > 0 {
				g.funcs = append(g.funcs, line[:i])
			}
		}
		gs = append(gs, g)
	}
	return gs
}
