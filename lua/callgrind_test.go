package lua_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/redisproc"
	"github.com/redsem/redsem/lua"
)

// TestScriptInstructions counts the CPU instructions Redis spends per script
// call, for each workload of BenchmarkScripts run as functions (FCALL): the
// server runs under valgrind's callgrind, whose counts, unlike times, repeat
// from run to run whatever else the machine is doing, so that a change to a
// script can be measured by a few percent on a shared machine. It counts
// everything the server does for the calls (reading the pipelined
// requests, the scripts, their commands, the replies), after a warm-up.
//
// Counts are not time, and the benchmarks (BenchmarkScripts, redsem bench)
// are the measure of speed: instructions differ in cost, and under
// valgrind each call takes about 50 times longer, so the steps the scripts
// run at most every 100 ms of server time (prune) run on far more calls
// than at speed. Use the counts to see where a script's work goes, then
// time the change.
//
// It needs valgrind and runs only when asked (it takes about a minute):
//
//	REDSEM_CALLGRIND=1 go test ./lua -run TestScriptInstructions -v
//
// REDSEM_CALLGRIND_MODE=evalsha counts the scripts as EVALSHA calls
// instead (the path of a server that refuses FUNCTION, and of each
// engine's first calls), where every call also runs the whole lib's
// definitions: Lua 5.1 creates each function's closure and finds each of
// its upvalues in a list of those already taken, so that cost grows with
// the lib's functions and with what each uses.
// REDSEM_CALLGRIND_RUN=REGEXP counts only the workloads whose name it
// matches; REDSEM_CALLGRIND_ARGS adds arguments to redis-server's command line (e.g.
// "--hash-max-listpack-entries 0"); REDSEM_CALLGRIND_KEEP=DIR keeps callgrind's output files there, for
// callgrind_annotate.
func TestScriptInstructions(t *testing.T) {
	if os.Getenv("REDSEM_CALLGRIND") == "" {
		t.Skip("set REDSEM_CALLGRIND=1 to count instructions per script call under callgrind")
	}
	var only *regexp.Regexp
	if re := os.Getenv("REDSEM_CALLGRIND_RUN"); re != "" {
		var err error
		if only, err = regexp.Compile(re); err != nil {
			t.Fatalf("REDSEM_CALLGRIND_RUN: %v", err)
		}
	}
	bin, err := redisproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		t.Fatal(err)
	}
	port, err := redisproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("REDSEM_CALLGRIND_KEEP")
	if dir == "" {
		dir = t.TempDir()
	}
	out := filepath.Join(dir, "callgrind.out")
	args := []string{"--tool=callgrind", "--callgrind-out-file=" + out + ".%p",
		bin, "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no"}
	cmd := exec.Command(vg, append(args, strings.Fields(os.Getenv("REDSEM_CALLGRIND_ARGS"))...)...)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := strconv.Itoa(cmd.Process.Pid)

	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	for deadline := time.Now().Add(time.Minute); c.Ping(ctx).Err() != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server under valgrind did not answer within a minute")
		}
	}
	_, lib := lua.Library()
	if err := c.FunctionLoad(ctx, lib).Err(); err != nil {
		t.Fatal(err)
	}
	mode := "fcall"
	switch m := os.Getenv("REDSEM_CALLGRIND_MODE"); m {
	case "", "fcall":
	case "evalsha":
		mode = m
	default:
		t.Fatalf("REDSEM_CALLGRIND_MODE=%q: want fcall or evalsha", m)
	}
	const pipe, rounds = 100, 5
	n := 0
	for _, sc := range scriptCases(ctx, c, mode) {
		if only != nil && !only.MatchString(sc.name) {
			continue
		}
		n++
		k := core.KeysFor("redsem", "cg-"+sc.name)
		if sc.setup != nil {
			if err := sc.setup(k); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := runPipe(ctx, c, k, sc.do, 0, pipe); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command("callgrind_control", "--zero", pid).CombinedOutput(); err != nil {
			t.Fatalf("callgrind_control --zero: %v: %s", err, b)
		}
		calls := 0
		for r := 1; r <= rounds; r++ {
			cmds, err := runPipe(ctx, c, k, sc.do, r*pipe, pipe)
			if err != nil {
				t.Fatal(err)
			}
			calls += len(cmds)
		}
		if b, err := exec.Command("callgrind_control", "--dump="+sc.name, pid).CombinedOutput(); err != nil {
			t.Fatalf("callgrind_control --dump: %v: %s", err, b)
		}
		ir, err := dumpTotal(out+"."+pid, n)
		if err != nil {
			t.Fatal(err)
		}
		meta := k.List[core.KeyMeta]
		enc, _ := c.ObjectEncoding(ctx, meta).Result()
		t.Logf("%-7s %-26s %8.0f instructions per script call (%d calls, %d per cycle; meta: %s of %d fields)",
			mode, sc.name, float64(ir)/float64(calls), calls, calls/(rounds*pipe), enc, c.HLen(ctx, meta).Val())
	}
}

// dumpTotal returns the total instruction count of callgrind's n-th dump
// (file base.n), waiting for it to appear.
func dumpTotal(base string, n int) (int64, error) {
	name := fmt.Sprintf("%s.%d", base, n)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		f, err := os.Open(name)
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "totals: "); ok {
					return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				}
			}
			return 0, fmt.Errorf("%s: no totals line", name)
		}
		if time.Now().After(deadline) {
			return 0, err
		}
	}
}
