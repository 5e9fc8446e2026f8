package main

import (
	"io"

	"github.com/redsem/redsem/cmd/redsem/internal/bench"
)

// runBench is "redsem bench": the harness of package bench, which also
// serves the child processes of --procs (re-run as "redsem bench --child").
func runBench(args []string, stdout, stderr io.Writer) int {
	return bench.Main(args, stdout, stderr)
}
