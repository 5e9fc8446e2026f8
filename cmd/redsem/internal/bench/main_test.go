package bench_test

import (
	"os"
	"testing"

	"github.com/redsem/redsem/cmd/redsem/internal/bench"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	// "--procs" re-executes os.Executable() with "bench --child ...": under
	// go test that is this binary, which then acts as the command.
	if len(os.Args) > 2 && os.Args[1] == bench.ChildCommand {
		os.Exit(bench.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(redistest.MainNoLeaks(m))
}
