package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redsem/redsem/internal/redistest"
)

func TestBenchUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"nope"}, 2},
		{[]string{"help"}, 0},
		{[]string{"bench", "-h"}, 0},
		{[]string{"bench", "--bogus"}, 2},
		{[]string{"bench", "--limit", "0"}, 2},
		{[]string{"bench", "--variant", "fast"}, 2},
		{[]string{"bench", "--hold", "gauss:2ms"}, 2},
		{[]string{"bench", "--procs", "3", "--workers", "2"}, 2},
		{[]string{"bench", "--variant", "local", "--procs", "2"}, 2},
		{[]string{"bench", "extra"}, 2},
	} {
		var out, errOut bytes.Buffer
		if got := run(c.args, &out, &errOut); got != c.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, got, c.code, errOut.String())
		}
	}
}

// runJSON runs the bench command and decodes its JSON lines.
func runJSON(t *testing.T, args ...string) []runResult {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(append([]string{"bench", "--json", "--quiet"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rs []runResult
	dec := json.NewDecoder(strings.NewReader(out.String()))
	for dec.More() {
		var r runResult
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("bad JSON %q: %v", out.String(), err)
		}
		rs = append(rs, r)
	}
	return rs
}

// The bench tool's own numbers must be consistent: never more holders than
// the limit, no errors, holds counted, and Redis costs measured for Redis
// variants. (How fast anything runs is not asserted.)
func TestBenchRunsEveryVariant(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	rs := runJSON(t, "--redis", url, "--variant", "local,fair,unfair,naive-zset,naive-counter",
		"--limit", "2", "--workers", "6", "--hold", "uniform:1ms-2ms", "--duration", "300ms", "--naive-retry", "5ms")
	if len(rs) != 5 {
		t.Fatalf("%d results, want 5", len(rs))
	}
	for _, r := range rs {
		if r.Holds == 0 || r.Errors != 0 || r.MaxHolders < 1 || r.MaxHolders > 2 {
			t.Errorf("%s: holds %d errors %d (%s) max holders %d", r.Variant, r.Holds, r.Errors, r.LastError, r.MaxHolders)
		}
		if r.Utilisation <= 0 || r.Utilisation > 1 {
			t.Errorf("%s: utilisation %v outside (0, 1]", r.Variant, r.Utilisation)
		}
		if r.Variant != "local" && (r.CommandsPerHold < 2 || r.PingRTTUs <= 0) {
			t.Errorf("%s: %v commands per hold, PING %v µs", r.Variant, r.CommandsPerHold, r.PingRTTUs)
		}
		if (r.Variant == "fair" || r.Variant == "unfair") && (r.UncontendedCmdsCycle < 2 || r.UncontendedOverRTT <= 0) {
			t.Errorf("%s: uncontended %v commands per cycle, %v RTT", r.Variant, r.UncontendedCmdsCycle, r.UncontendedOverRTT)
		}
	}
}

// --procs re-executes the test binary as child workers.
func TestBenchProcs(t *testing.T) {
	url := "redis://" + redistest.Shared(t).Addr
	rs := runJSON(t, "--redis", url, "--variant", "fair", "--procs", "2", "--limit", "2", "--workers", "4",
		"--duration", "300ms")
	if len(rs) != 1 {
		t.Fatalf("%d results", len(rs))
	}
	r := rs[0]
	if r.Holds == 0 || r.Errors != 0 || r.MaxHolders > 2 || r.Procs != 2 {
		t.Errorf("procs run: %+v", r)
	}
}
