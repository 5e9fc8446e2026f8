package redistest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// MainNoLeaks is Main followed by a goroutine-leak check: when the tests
// passed, any goroutine still running after the shared server stopped (and
// not matched by opts, e.g. goleak.IgnoreTopFunction for a known
// long-lived one) fails the test binary with the goroutines' stacks. Use it
// from TestMain: func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }.
func MainNoLeaks(m *testing.M, opts ...goleak.Option) int {
	code := Main(m)
	if code != 0 {
		return code
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: goroutines left running after the tests: %v\n", err)
		return 1
	}
	return code
}
