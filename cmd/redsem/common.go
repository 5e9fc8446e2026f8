package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

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
	key string       // --key, on the commands that take it (withKey); "" without
	fam *core.Family // the family that --key's member belongs to, once opened
	// noShardRecord: --key's family has no shard record (no client of
	// this version used it yet): its member was addressed with one shard.
	noShardRecord bool
}

func newCommand(name, synopsis, about string, stdout, stderr io.Writer) *command {
	return &command{Command: cli.New(name, synopsis, about, stdout, stderr)}
}

// session is an open semaphore: what status, watch, set-limit, release and
// purge work on.
type session struct {
	client redis.UniversalClient
	t      *cli.Target
	e      *core.Engine    // with --key: the family member's
	prefix string          // --prefix
	family string          // with --key: the family's name
	close  func()          // closes the family opened for --key, if any, and client (openRead: and ends ctx)
	ctx    context.Context // openRead's, bounded by cli.OpTimeout
	s      *snapshot       // openRead's: the state, read once
}

// open connects to --redis and opens semaphore name (with --key: member
// KEY of the family name) to read and change its state. Its limit (1) is
// only the fallback the scripts use when no limit is established. On a bad
// --redis or name it reports the error and returns stop with the exit
// code; otherwise the caller closes the session.
func (c *command) open(name string) (ss *session, code int, stop bool) {
	t, err := cli.ParseTarget(c.Redis)
	if err != nil {
		return nil, c.UsageError("%v", err), true
	}
	client := t.Client()
	ss = &session{client: client, t: t, prefix: c.Prefix, close: func() { _ = client.Close() }}
	cfg := core.Config{Client: client, Name: name, Limit: 1, Prefix: c.Prefix, Logger: slog.New(slog.DiscardHandler)}
	if c.key != "" {
		ss.family = name
		ss.e, err = c.openMember(ss, cfg, c.key)
	} else {
		ss.e, err = core.New(cfg)
	}
	if err != nil {
		ss.close()
		return nil, c.Fail(err), true
	}
	return ss, 0, false
}

// openMember opens member key of the family cfg.Name for open. The
// family's shard count decides the member's keys: the one its first user
// recorded (none: one shard, the layout of families made before shards
// existed).
func (c *command) openMember(ss *session, cfg core.Config, key string) (*core.Engine, error) {
	cfg.Fair = true // either variant: the scripts and the keys are the same
	ctx, cancel := cli.OpContext(context.Background())
	defer cancel()
	shards, recorded, err := core.ReadShards(ctx, ss.client, c.Prefix, cfg.Name)
	if err != nil {
		return nil, cli.ReachErr(ss.t, err)
	}
	c.noShardRecord = !recorded
	if c.fam, err = core.NewFamily(cfg, 0, shards, 0); err != nil {
		return nil, err
	}
	ss.close = func() { _ = c.fam.Close(); _ = ss.client.Close() }
	return c.fam.Get(key)
}

// withKey adds --key, which makes NAME a keyed family and the command
// address its member KEY.
func (c *command) withKey() {
	c.FS.StringVar(&c.key, "key", "", "address member `KEY` of the keyed family NAME (fair.NewFamily(client, NAME, ...).Get(KEY)) instead of the semaphore NAME")
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
	if c.key != "" {
		return name + " --key " + c.key
	}
	return name
}

// openRead opens semaphore name (see open) and reads its state, checking
// holders against leaseTTL (0: unknown), in one context bounded by
// cli.OpTimeout. On failure it reports the error and returns stop with the
// exit code; otherwise the caller closes the session.
func (c *command) openRead(name string, leaseTTL time.Duration) (ss *session, code int, stop bool) {
	if ss, code, stop = c.open(name); stop {
		return nil, code, true
	}
	ctx, cancel := cli.OpContext(context.Background())
	closeClient := ss.close
	ss.ctx, ss.close = ctx, func() { cancel(); closeClient() }
	var err error
	if ss.s, err = ss.read(ctx, leaseTTL); err != nil {
		ss.close()
		return nil, c.Fail(cli.ReachErr(ss.t, err)), true
	}
	return ss, 0, false
}

// parseRead parses args (nargs arguments, NAME first) as Parse does, opens
// NAME with its state read once (openRead), and returns what body returns,
// closing the session after it; on a failure before body it returns the
// exit code without running body.
func (c *command) parseRead(args []string, nargs int, argNames string, body func(pos []string, ss *session) int) int {
	pos, code, stop := c.Parse(args, nargs, argNames)
	if stop {
		return code
	}
	ss, code, stop := c.openRead(pos[0], 0)
	if stop {
		return code
	}
	defer ss.close()
	return body(pos, ss)
}
