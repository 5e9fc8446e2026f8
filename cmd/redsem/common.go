package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
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
type command struct {
	*cli.Command
	key *string      // --key, on the commands that take it (withKey)
	fam *core.Family // the family that --key's member belongs to, once opened
	// noShardRecord: --key's family has no shard record (no client of
	// this version used it yet): its member was addressed with one shard.
	noShardRecord bool
}

func newCommand(name, synopsis, about string, stdout, stderr io.Writer) *command {
	return &command{Command: cli.New(name, synopsis, about, stdout, stderr)}
}

// open connects to --redis and returns the engine used to read and change
// semaphore name's state. Its limit (1) is only the fallback the scripts use
// when no limit is established. On a bad --redis or name it reports the
// error and returns stop with the exit code; otherwise the caller closes
// client with done. With --key, name is a family and the engine is its
// member's.
func (c *command) open(name string) (client redis.UniversalClient, t *cli.Target, e *core.Engine, code int, stop bool) {
	t, err := cli.ParseTarget(c.Redis)
	if err != nil {
		return nil, nil, nil, c.UsageError("%v", err), true
	}
	client = t.Client()
	cfg := core.Config{Client: client, Name: name, Limit: 1, Prefix: c.Prefix, Logger: slog.New(slog.DiscardHandler)}
	if key := c.member(); key != "" {
		cfg.Fair = true // either variant: the scripts and the keys are the same
		// The family's shard count decides the member's keys: the one its
		// first user recorded (none: one shard, the layout of families made
		// before shards existed).
		ctx, cancel := cli.OpContext(context.Background())
		shards, recorded, err := core.ReadShards(ctx, client, c.Prefix, name)
		cancel()
		c.noShardRecord = !recorded
		if err != nil {
			c.done(client)
			return nil, nil, nil, c.Fail(cli.ReachErr(t, err)), true
		}
		if c.fam, err = core.NewFamily(cfg, 0, shards); err == nil {
			e, err = c.fam.Get(key)
		}
	} else {
		e, err = core.New(cfg)
	}
	if err != nil {
		c.done(client)
		return nil, nil, nil, c.Fail(err), true
	}
	return client, t, e, 0, false
}

// withKey adds --key, which makes NAME a keyed family and the command
// address its member KEY.
func (c *command) withKey() {
	c.key = c.FS.String("key", "", "address member `KEY` of the keyed family NAME (fair.NewFamily(client, NAME, ...).Get(KEY)) instead of the semaphore NAME")
}

// member is --key's value ("" without it).
func (c *command) member() string {
	if c.key == nil {
		return ""
	}
	return *c.key
}

// what names the semaphore e for messages: "NAME", or, with --key,
// member "KEY" of family "NAME".
func (c *command) what(e *core.Engine) string {
	if c.fam != nil {
		return fmt.Sprintf("member %q of family %q", e.Name(), c.fam.Name())
	}
	return strconv.Quote(e.Name())
}

// statusArgs is the argument list of the status command that shows name
// (with --key when the command was given one).
func (c *command) statusArgs(name string) string {
	if k := c.member(); k != "" {
		return name + " --key " + k
	}
	return name
}

// done closes the family opened for --key, if any, and client.
func (c *command) done(client redis.UniversalClient) {
	if c.fam != nil {
		_ = c.fam.Close()
		c.fam = nil
	}
	_ = client.Close()
}

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
	ss = &session{ctx: ctx, client: client, t: t, e: e, close: func() { cancel(); c.done(client) }}
	s, err := read(ctx, client, e, c.Prefix, o)
	if err != nil {
		ss.close()
		return nil, c.Fail(cli.ReachErr(t, err)), true
	}
	ss.s = s
	return ss, 0, false
}
