package bench_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redsem/redsem/cmd/redsem/internal/bench"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMainUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		err  string // in stderr
	}{
		{[]string{"-h"}, 0, ""},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--limit", "0"}, 2, "--limit 0"},
		{[]string{"--variant", "fast"}, 2, `--variant "fast"`},
		{[]string{"--hold", "gauss:2ms"}, 2, "bad hold"},
		{[]string{"--procs", "3", "--workers", "2"}, 2, "--procs 3"},
		{[]string{"--variant", "local", "--procs", "2"}, 2, "use --procs 1"},
		{[]string{"--weights", "3-1"}, 2, "bad weights"},
		{[]string{"--weights", "1-9", "--limit", "5"}, 2, "more than --limit"},
		{[]string{"--weights", "1-2", "--variant", "naive-zset"}, 2, "has no AcquireN"},
		{[]string{"--redis", "nohostport", "--variant", "fair"}, 2, "bad --redis address"},
		{[]string{"extra"}, 2, "too many arguments"},
		{[]string{"--rate", "x"}, 2, "--rate"},
		{[]string{"--rate", "0/1s"}, 2, "--rate"},
		{[]string{"--rate", "5/1s", "--variant", "local"}, 2, "variant local has no rate"},
		{[]string{"--rate", "2/1s", "--weights", "1-3"}, 2, "more than the rate's 2 slots"},
	} {
		var out, errOut bytes.Buffer
		got := bench.Main(c.args, &out, &errOut)
		if got != c.code || !strings.Contains(errOut.String(), c.err) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d, %q", c.args, got, errOut.String(), c.code, c.err)
		}
		if c.code == 2 && strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("%v: usage error is not one line: %q", c.args, errOut.String())
		}
	}
}

// result is the part of a --json line the tests read; the field names are
// those that the peer comparison (peers/summary.py) reads too.
type result struct {
	Variant         string   `json:"variant"`
	Procs           int      `json:"procs"`
	Weights         string   `json:"weights"`
	Holds           int      `json:"holds"`
	HoldsPerSec     float64  `json:"holds_per_s"`
	Utilisation     float64  `json:"utilisation"`
	WaitP99Ms       *float64 `json:"wait_p99_ms"`
	Jain            float64  `json:"jain"`
	MaxHolders      int      `json:"max_holders"`
	MeanWeight      float64  `json:"mean_weight"`
	CommandsPerHold float64  `json:"commands_per_hold"`
	RedisCalls      *float64 `json:"redis_calls_per_hold"`
	RedisCPU        *float64 `json:"redis_cpu_us_per_hold"`
	PingRTTUs       float64  `json:"ping_rtt_us"`
	UncontendedCmds float64  `json:"uncontended_commands_per_cycle"`
	Rate            *struct {
		On            string  `json:"on"`
		Granted       int64   `json:"granted"`
		Allowed       int64   `json:"allowed"`
		Achieved      float64 `json:"achieved"`
		BusiestWindow int64   `json:"busiest_window"`
	} `json:"rate"`
	UncontendedRTT  float64 `json:"uncontended_over_rtt"`
	UncontendedRate float64 `json:"uncontended_cycles_per_s"`
	Errors          int     `json:"errors"`
	LastError       string  `json:"last_error"`
	ScriptCalls     float64 `json:"script_calls_per_hold"`
	ScriptUs        float64 `json:"script_us_per_call"`
	Scripts         []struct {
		Script       string  `json:"script"`
		CallsPerHold float64 `json:"calls_per_hold"`
		UsPerCall    float64 `json:"us_per_call"`
	} `json:"scripts"`
}

// runJSON runs the bench and decodes its JSON lines.
func runJSON(t *testing.T, args ...string) []result {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := bench.Main(append([]string{"--json", "--quiet"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rs []result
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", line, err)
		}
		var raw map[string]any
		_ = json.Unmarshal([]byte(line), &raw)
		if _, ok := raw["ideal_wait_ms"]; !ok {
			t.Errorf("%s: no ideal_wait_ms in %s", r.Variant, line)
		}
		if r.WaitP99Ms == nil || r.RedisCalls == nil || r.RedisCPU == nil {
			t.Errorf("%s: a field that peers.sh reads is missing: %s", r.Variant, line)
		}
		rs = append(rs, r)
	}
	return rs
}

// The bench tool's own numbers must be consistent: never more holders than
// the limit, no errors, holds counted, and Redis costs measured for Redis
// variants. (How fast anything runs is not asserted.)
func TestRunsEveryVariant(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	rs := runJSON(t, "--redis", url, "--variant", "local,fair,unfair,naive-zset,naive-counter,floor",
		"--limit", "2", "--workers", "6", "--hold", "uniform:1ms-2ms", "--duration", "300ms", "--naive-retry", "5ms")
	if len(rs) != 6 {
		t.Fatalf("%d results, want 6", len(rs))
	}
	for _, r := range rs {
		if r.Holds == 0 || r.Errors != 0 || r.MaxHolders < 1 || r.MaxHolders > 2 || r.Procs != 1 {
			t.Errorf("%s: holds %d errors %d (%s) max holders %d procs %d", r.Variant, r.Holds, r.Errors, r.LastError, r.MaxHolders, r.Procs)
		}
		if r.Utilisation <= 0 || r.Utilisation > 1 {
			t.Errorf("%s: utilisation %v outside (0, 1]", r.Variant, r.Utilisation)
		}
		if r.Variant != "local" && (r.CommandsPerHold < 2 || r.PingRTTUs <= 0) {
			t.Errorf("%s: %v commands per hold, PING %v µs", r.Variant, r.CommandsPerHold, r.PingRTTUs)
		}
		if (r.Variant == "fair" || r.Variant == "unfair") && (r.UncontendedCmds < 2 || r.UncontendedRTT <= 0 || r.UncontendedRate <= 0) {
			t.Errorf("%s: uncontended %v commands per cycle, %v RTT", r.Variant, r.UncontendedCmds, r.UncontendedRTT)
		}
		if r.Variant == "fair" || r.Variant == "unfair" {
			// Per script: acquire and release each ran, and the SLOWLOG
			// split accounts for every script call commandstats saw.
			calls, seen := 0.0, map[string]bool{}
			for _, sc := range r.Scripts {
				calls += sc.CallsPerHold
				seen[sc.Script] = sc.CallsPerHold > 0 && sc.UsPerCall > 0
			}
			if !seen["acquire"] || !seen["release"] || r.ScriptUs <= 0 {
				t.Errorf("%s: per-script costs %+v, %v µs per script call", r.Variant, r.Scripts, r.ScriptUs)
			}
			if d := calls - r.ScriptCalls; d > 0.01*r.ScriptCalls || d < -0.01*r.ScriptCalls {
				t.Errorf("%s: SLOWLOG saw %.3f script calls per hold, commandstats %.3f", r.Variant, calls, r.ScriptCalls)
			}
		}
	}
}

// --procs re-executes the test binary as child workers, with --prefix.
func TestProcs(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	rs := runJSON(t, "--redis", url, "--prefix", "benchtest", "--variant", "fair", "--procs", "2", "--limit", "2",
		"--workers", "4", "--duration", "300ms")
	if len(rs) != 1 {
		t.Fatalf("%d results", len(rs))
	}
	if r := rs[0]; r.Holds == 0 || r.Errors != 0 || r.MaxHolders > 2 || r.Procs != 2 {
		t.Errorf("procs run: %+v", r)
	}
}

// --weights on the local variant: holds take 1 to 3 of 4 slots, the slots
// in use never exceed the limit, and utilisation counts slot-time.
func TestWeightsLocal(t *testing.T) {
	rs := runJSON(t, "--variant", "local", "--weights", "1-3", "--limit", "4", "--workers", "6",
		"--hold", "2ms", "--duration", "300ms")
	r := rs[0]
	if r.Holds == 0 || r.Errors != 0 || r.MaxHolders > 4 || r.Weights != "1-3" {
		t.Fatalf("weighted run: %+v", r)
	}
	if r.MeanWeight <= 1 || r.MeanWeight >= 3 {
		t.Errorf("mean weight %v, want in (1, 3)", r.MeanWeight)
	}
	if r.Utilisation <= 0 || r.Utilisation > 1 {
		t.Errorf("utilisation %v outside (0, 1]", r.Utilisation)
	}
}

// Until fair and unfair have AcquireN, --weights on them is a usage error
// that says why; once they have it, the run works.
func TestWeightsRedsem(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	for _, v := range []string{"fair", "unfair"} {
		args := []string{"--redis", url, "--variant", v, "--weights", "1-2", "--limit", "3", "--workers", "4",
			"--duration", "300ms"}
		if !bench.Weighable(v) {
			var out, errOut bytes.Buffer
			if code := bench.Main(args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "no AcquireN") {
				t.Errorf("%s: exit %d, stderr %q; want 2 and a word on AcquireN", v, code, errOut.String())
			}
			continue
		}
		r := runJSON(t, args...)[0]
		if r.Holds == 0 || r.Errors != 0 || r.MaxHolders > 3 {
			t.Errorf("%s weighted run: %+v", v, r)
		}
	}
}

// --rate 10/200ms over two processes: no window of 200 ms of grant tokens
// holds more than 10 slots, and most of what the rate allows is granted.
func TestRateRedsem(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	for _, r := range runJSON(t, "--redis", url, "--variant", "fair,unfair", "--limit", "4", "--workers", "12",
		"--procs", "2", "--hold", "5ms", "--rate", "10/200ms", "--duration", "1s") {
		if r.Rate == nil || r.Rate.On != "token" || r.Rate.Allowed != 50 || r.Rate.BusiestWindow > 10 ||
			r.Rate.Achieved < 0.8 || r.Errors != 0 || r.MaxHolders > 4 {
			t.Errorf("%s under --rate 10/200ms: %+v, rate %+v", r.Variant, r, r.Rate)
		}
	}
}

// --family: each variant runs with the total and without one; the workers
// never counted more than the total held, the cold tenant was served, and
// every run measured a hold's cost.
func TestFamilyWorkload(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	var out, errOut bytes.Buffer
	code := bench.Main([]string{"--redis", url, "--variant", "fair,unfair", "--family", "3", "--limit", "2", "--workers", "6",
		"--hold", "2ms", "--duration", "300ms", "--json", "--quiet"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	var runs []bench.FamilyResult
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r bench.FamilyResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		runs = append(runs, r)
	}
	if len(runs) != 4 {
		t.Fatalf("%d runs, want 4 (two variants, with and without a total)", len(runs))
	}
	for _, r := range runs {
		if (r.Total > 0 && r.PeakHeld > r.Total) || r.Hot.Holds == 0 || r.Cold.Holds == 0 || r.HoldCost <= 0 || r.Utilisation <= 0 {
			t.Errorf("%+v", r)
		}
	}
	var u bytes.Buffer
	if code := bench.Main([]string{"--variant", "local", "--family", "3"}, &u, &u); code != 2 {
		t.Errorf("--family with local: exit %d, want 2 (%s)", code, u.String())
	}
}
