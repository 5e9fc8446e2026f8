package main

import (
	"io"

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
	e, err = core.New(core.Config{Client: client, Name: name, Limit: 1, Prefix: c.Prefix})
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
