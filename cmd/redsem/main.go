// Command redsem is redsem's command-line tool. Subcommands:
//
//	redsem bench [flags]   run a semaphore workload and report utilisation,
//	                       waits, handoff latency and Redis cost (see
//	                       docs/benchmarks.md; redsem bench -h for flags)
//
// Exit codes: 0 success, 1 error, 2 usage.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "bench":
		return runBench(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "redsem: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: redsem <command> [flags]

commands:
  bench   run a semaphore workload against Redis and report utilisation,
          waits, handoff latency and Redis cost per hold

Run "redsem <command> -h" for the flags of a command.
`)
}
