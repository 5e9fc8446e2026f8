// Package property_test holds redsem's property tests: rapid state machines
// that drive the unfair and fair semaphores against a real redis-server side
// by side with an in-memory reference model, and a multi-process overlap
// check. See docs/testing.md for what is tested and how to replay a failure.
package property_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	_ "github.com/redsem/redsem/internal/testkit/container" // Redis in a container where no redis-server is installed
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Budget: rapid's defaults (100 checks of ~30 steps) take minutes against a
// real Redis on a small machine. Unless the command line or the RAPID_*
// environment sets them, CI runs a few checks; REDSEM_SOAK=1 runs many.
const (
	ciChecks   = "25"
	soakChecks = "300"
)

func soak() bool { return os.Getenv("REDSEM_SOAK") != "" }

// userChecks: the command line or RAPID_CHECKS chose the number of checks.
var userChecks bool

func TestMain(m *testing.M) {
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	userChecks = set["rapid.checks"] || os.Getenv("RAPID_CHECKS") != ""
	if !userChecks {
		n := ciChecks
		if soak() {
			n = soakChecks
		}
		_ = flag.Set("rapid.checks", n)
	}
	if !set["rapid.shrinktime"] && os.Getenv("RAPID_SHRINKTIME") == "" {
		_ = flag.Set("rapid.shrinktime", "60s")
	}
	if os.Getenv(helperEnv) != "" {
		os.Exit(m.Run()) // a child process of TestConcurrentProcesses
	}
	os.Exit(redistest.MainNoLeaks(m))
}

// trace writes a progress line to stderr when REDSEM_PROPERTY_TRACE is set
// (used to measure how fast a deliberate bug is found; see docs/testing.md).
func trace(format string, args ...any) {
	if os.Getenv("REDSEM_PROPERTY_TRACE") != "" {
		fmt.Fprintf(os.Stderr, "property: "+format+"\n", args...)
	}
}
