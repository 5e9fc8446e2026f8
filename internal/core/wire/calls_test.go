package wire

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// luaSources reads the semaphore scripts' files (not the fencing ones,
// which have their own protocol in package fencing).
func luaSources(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../../../lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no lua files: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "fence") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = string(b)
	}
	return out
}

// TestAcquireCodesKnown holds acquire.lua's reply codes (the integer that
// opens each reply table) to the ones declared in calls.go, both ways:
// a code the script returns that Go does not know would fail every call
// that gets it ("unknown code"), and a code Go declares that no script
// returns is a stale declaration.
func TestAcquireCodesKnown(t *testing.T) {
	src := luaSources(t)["acquire.lua"]
	if src == "" {
		t.Fatal("acquire.lua not found")
	}
	seen := map[int64]bool{}
	for _, m := range regexp.MustCompile(`\{\s*(-?\d+)\s*,\s*now\b`).FindAllStringSubmatch(src, -1) {
		seen[toInt(m[1])] = true
	}
	for code := range seen {
		if _, ok := acquireCodes[code]; !ok {
			t.Errorf("acquire.lua returns code %d, which calls.go does not declare", code)
		}
	}
	for code, name := range acquireCodes {
		if !seen[code] {
			t.Errorf("calls.go declares code %d (%s), which acquire.lua never returns", code, name)
		}
	}
	// Every declared code decodes: decodeAttempt knows them all.
	for code := range acquireCodes {
		v := []any{code, int64(0)}
		switch code {
		case CodeGranted:
			v = append(v, int64(1), int64(100), int64(0))
		case CodeQueued:
			v = append(v, int64(-1), int64(0))
		case codeMismatch, codeWeight, codeQueueFull, codeTotalDiffer:
			v = append(v, int64(3))
		case codeRateDiffers:
			v = append(v, "2/1000")
		}
		if _, err := decodeAttempt(v, time.Time{}); err != nil {
			t.Errorf("code %d (%s): %v", code, acquireCodes[code], err)
		}
	}
}

// TestScriptRefusalsKnown holds every error reply the scripts make
// (the Lua library's fail) to the beginnings declared in scriptRefusals, both ways.
func TestScriptRefusalsKnown(t *testing.T) {
	used := map[string]bool{}
	re := regexp.MustCompile(`\bfail\(\s*'([^']*)'`)
	for file, src := range luaSources(t) {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			i := slices.IndexFunc(scriptRefusals, func(p string) bool { return strings.HasPrefix(m[1], p) })
			if i < 0 {
				t.Errorf("%s: fail(%q) begins with none of %q", file, m[1], scriptRefusals)
				continue
			}
			used[scriptRefusals[i]] = true
		}
	}
	for _, p := range scriptRefusals {
		if !used[p] {
			t.Errorf("scriptRefusals declares %q, which no script's fail begins with", p)
		}
	}
}

// ParseFree reads every form of the unfair freed-slot notice: "n META",
// a bare "n" (an older version: of any semaphore), "0 META ms at" (the
// window is full; at: when the script ran) and the older "0 META ms".
func TestParseFree(t *testing.T) {
	type parsed struct {
		count    int
		meta     string
		wait, at int64
		held     bool
	}
	for payload, want := range map[string]parsed{
		"3 redsem:{a}:meta":                   {count: 3, meta: "redsem:{a}:meta"},
		"2":                                   {count: 2},
		"0 redsem:{a}:meta 120 1796599411117": {meta: "redsem:{a}:meta", wait: 120, at: 1796599411117, held: true},
		"0 redsem:{a}:meta 120":               {meta: "redsem:{a}:meta", wait: 120, held: true},
		"0 redsem:{a}:meta -5 x":              {meta: "redsem:{a}:meta", held: true},
		"junk redsem:{a}:meta":                {count: 1, meta: "redsem:{a}:meta"},
	} {
		var got parsed
		got.count, got.meta, got.wait, got.at, got.held = ParseFree(payload)
		if got != want {
			t.Errorf("ParseFree(%q) = %+v, want %+v", payload, got, want)
		}
	}
}
