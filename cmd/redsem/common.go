package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/cli"
	"github.com/redsem/redsem/internal/core"
)

// Exit codes (those of package cli, shared with the bench harness).
const (
	exitOK    = cli.ExitOK
	exitError = cli.ExitError
	exitUsage = cli.ExitUsage
)

// command is one subcommand: the shared flag set and helpers of package
// cli, plus open for the commands that read and change a semaphore's keys.
type command struct{ *cli.Command }

// newCommand makes the flag set of a subcommand; see cli.New.
func newCommand(name, synopsis, about string, stdout, stderr io.Writer) *command {
	return &command{cli.New(name, synopsis, about, stdout, stderr)}
}

// open connects to --redis and returns the engine used to read and change
// semaphore name's state. Its limit (1) is only the fallback the scripts use
// when no limit is established. On a bad --redis or name it reports the
// error and returns stop with the exit code; otherwise the caller closes
// client.
func (c *command) open(name string) (client redis.UniversalClient, t *cli.Target, e *core.Engine, code int, stop bool) {
	t, err := cli.ParseTarget(c.Redis)
	if err != nil {
		return nil, nil, nil, c.UsageError("%v", err), true
	}
	client = t.Client()
	// The command reports failures itself, in one line: the engine's own
	// Warn records (Redis unreachable, ...) would repeat them.
	e, err = core.New(core.Config{Client: client, Name: name, Limit: 1, Prefix: c.Prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		_ = client.Close()
		return nil, nil, nil, c.Fail(err), true
	}
	return client, t, e, 0, false
}

// semaphoreKeys lists every key of semaphore name under prefix (what purge
// deletes), by asking package core, which owns the key layout.
func semaphoreKeys(client redis.UniversalClient, prefix, name string) ([]string, error) {
	e, err := core.New(core.Config{Client: client, Name: name, Limit: 1, Prefix: prefix})
	if err != nil {
		return nil, err
	}
	return e.Keys().List, nil
}

// session is an open semaphore with its state read once: what status,
// set-limit, release and purge start from.
type session struct {
	ctx    context.Context // bounded by cli.OpTimeout
	client redis.UniversalClient
	t      *cli.Target
	e      *core.Engine
	s      *snapshot
	close  func() // ends ctx and closes client
}

// openRead opens semaphore name (see open) and reads its state with o, in
// one context bounded by cli.OpTimeout. On failure it reports the error and
// returns stop with the exit code; otherwise the caller calls close.
func (c *command) openRead(name string, o readOpts) (ss *session, code int, stop bool) {
	client, t, e, code, stop := c.open(name)
	if stop {
		return nil, code, true
	}
	ctx, cancel := cli.OpContext(context.Background())
	ss = &session{ctx: ctx, client: client, t: t, e: e, close: func() { cancel(); _ = client.Close() }}
	s, err := read(ctx, client, e, c.Prefix, o)
	if err != nil {
		ss.close()
		return nil, c.Fail(cli.ReachErr(t, err)), true
	}
	ss.s = s
	return ss, 0, false
}
