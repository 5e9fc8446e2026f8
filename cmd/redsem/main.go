// Command redsem operates redsem semaphores: it shows who holds and who waits
// (status, watch), fixes a stuck semaphore at run time (set-limit, release,
// purge), runs a self-contained demo and measures (bench, the harness of
// cmd/redsem/internal/bench).
//
//	go run ./cmd/redsem demo
//	redsem status NAME [--key KEY] [--top N] [--json] [--lease-ttl 30s]
//	redsem watch NAME [--key KEY] [--top N] [--interval 1s] [--count N]
//	redsem set-limit NAME [N] [--rate LIMIT/PER] [--key KEY]
//	redsem release NAME ID [--key KEY]
//	redsem purge NAME [--key KEY] [--yes]
//	redsem bench [--variant fair,unfair,local] [--procs N] [--weights A-B] [--json]
//
// README.md's command table lists every command and flag; a test keeps it
// and the usage texts in sync.
//
// Every command takes --redis (a redis:// or rediss:// URL, or
// host:port[,host:port...] cluster seeds; default $REDIS_URL, else
// redis://127.0.0.1:6379) and --prefix (the key prefix; default "redsem").
// Exit codes: 0 ok, 1 error, 2 usage.
package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/cmd/redsem/internal/bench"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
)

// commands maps each subcommand to its run function: args after the
// command's name, output streams; it returns the exit code.
var commands = map[string]func(args []string, stdout, stderr io.Writer) int{
	"demo":      runDemo,
	"status":    runStatus,
	"watch":     runWatch,
	"set-limit": runSetLimit,
	"release":   runRelease,
	"purge":     runPurge,
	"bench":     bench.Main, // also the child processes of --procs ("redsem bench --child")
}

const usageText = `redsem operates redsem semaphores (distributed semaphores in Redis).

Usage:
  redsem <command> [flags] [arguments]

Commands:
  demo               run a self-contained demo: fair and unfair side by side,
                     fairness, fencing (starts its own Redis if needed)
  status NAME        holders, waiters, limit and warnings of semaphore NAME
                     (of keyed family NAME: its total, slots held and
                     queued, and its busiest members)
  watch NAME         the same, refreshed live (Ctrl-C to stop)
  set-limit NAME [N]  set the limit (--rate: the rate) of NAME for every
                     client, at once
  release NAME ID    force-release a holder (or remove a waiter) by id
  purge NAME         delete all of NAME's keys (asks first unless --yes)
  bench              run a workload and report utilisation, waits, handoff
                     and Redis cost per hold (see docs/benchmarks.md)

Flags every command takes:
  --redis URL        redis://[user:pass@]host:port[/db], rediss://... (TLS), or
                     host:port[,host:port...] cluster seeds
                     (default $REDIS_URL, else redis://127.0.0.1:6379)
  --prefix P         key prefix (default "redsem")

status, watch, set-limit, release and purge also take:
  --key KEY          address member KEY of the keyed family NAME
                     (fair.NewFamily(client, NAME, ...).Get(KEY)); status and
                     watch NAME without --key show the family NAME

Run 'redsem <command> -h' for the flags of a command.
Exit codes: 0 ok, 1 error, 2 usage.
`

func main() {
	redis.SetLogger(cli.QuietLogger{})
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args (without the program name) to a command.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		names := slices.Sorted(maps.Keys(commands))
		fmt.Fprintf(stderr, "redsem: unknown command %q (commands: %v; see 'redsem -h')\n", args[0], names)
		return exitUsage
	}
	return cmd(args[1:], stdout, stderr)
}
