package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cmd/redsem/internal/cli"
	"github.com/redsem/redsem/internal/core"
)

// stdin is where purge reads its confirmation (a variable so that tests
// can answer).
var stdin io.Reader = os.Stdin

func runSetLimit(args []string, stdout, stderr io.Writer) int {
	c := newCommand("set-limit", "NAME [N] [flags]",
		"Sets the limit of NAME to N for every client at once, overriding the limit\n"+
			"each was built with. It never expires. Raising it admits fair waiters at\n"+
			"once; lowering it revokes no lease: new grants wait until fewer than N slots are held.\n"+
			"With --rate, also (or, without N, only) sets the rate: at most LIMIT slots\n"+
			"granted in any window of PER, for every client (SetRate); --rate none removes it.", stdout, stderr)
	rateFlag := c.FS.String("rate", "", "also set the rate to `LIMIT/PER` (e.g. 60/1m, 100/1s, 5/250ms; none: no rate bound)")
	c.withKey()
	pos, code, stop := c.ParseBetween(args, 1, 2, "NAME N (N may be left out with --rate)")
	if stop {
		return code
	}
	n := 0
	if len(pos) == 2 {
		var err error
		if n, err = strconv.Atoi(pos[1]); err != nil || n < 1 || n > core.MaxLimit {
			return c.UsageError("limit %q is not an integer in [1, %d]", pos[1], core.MaxLimit)
		}
	}
	setRate := false
	var rate redsem.Rate
	c.FS.Visit(func(f *flag.Flag) { setRate = setRate || f.Name == "rate" })
	if setRate {
		var err error
		if rate, err = redsem.ParseRate(*rateFlag); err != nil {
			return c.UsageError("--rate: %v", err)
		}
		if rate, err = core.CheckRate("--rate", rate); err != nil {
			return c.UsageError("%v", err)
		}
	} else if n == 0 {
		return c.UsageError("missing arguments: want NAME N, or NAME --rate LIMIT/PER")
	}
	ss, code, stop := c.openRead(pos[0], readOpts{})
	if stop {
		return code
	}
	defer ss.close()
	ctx, t, e, before := ss.ctx, ss.t, ss.e, ss.s
	if n > 0 {
		if err := e.SetLimit(ctx, n); err != nil {
			return c.Fail(cli.ReachErr(t, err))
		}
		was := "unknown"
		if before.Limit != nil {
			was = strconv.Itoa(*before.Limit)
		}
		fmt.Fprintf(stdout, "limit of %s: %s -> %d (for every client, now; run 'redsem status %s' to see it)\n", c.what(e), was, n, c.statusArgs(pos[0]))
		if held := before.slotsHeld(); held > n {
			fmt.Fprintf(stdout, "note: %d slots are held; no lease is revoked, new grants wait until fewer than %d are held\n", held, n)
		}
	}
	if setRate {
		if err := e.SetRate(ctx, rate); err != nil {
			return c.Fail(cli.ReachErr(t, err))
		}
		was := before.Rate
		if was == "" {
			was = "none"
		}
		fmt.Fprintf(stdout, "rate of %s: %s -> %v (for every client, now; slots granted before still count in the window)\n", c.what(e), was, rate)
	}
	if c.noShardRecord {
		fmt.Fprintf(stderr, "note: family %q has no shard record yet (no client used it): this was written for a family of one shard; "+
			"clients built with Shards > 1 will not see it\n", pos[0])
	}
	return exitOK
}

func runRelease(args []string, stdout, stderr io.Writer) int {
	c := newCommand("release", "NAME ID [flags]",
		"Force-releases the holder with lease id ID (as shown by status; a unique\n"+
			"prefix is enough), with the script a client's Release runs (leaving no\n"+
			"tombstone), and admits the next waiters. The holder's process learns it at\n"+
			"its next renewal (within LeaseTTL/3): its lease reports ErrLeaseLost. ID\n"+
			"may also be a fair waiter's: it leaves the queue, and its process queues it\n"+
			"again at the back.", stdout, stderr)
	c.withKey()
	pos, code, stop := c.Parse(args, 2, "NAME ID")
	if stop {
		return code
	}
	ss, code, stop := c.openRead(pos[0], readOpts{})
	if stop {
		return code
	}
	defer ss.close()
	ctx, t, e, s := ss.ctx, ss.t, ss.e, ss.s
	id, err := resolveID(s, pos[1])
	if err != nil {
		return c.Fail(err)
	}
	kind, admitted, err := e.ForceRelease(ctx, id)
	if err != nil {
		return c.Fail(cli.ReachErr(t, err))
	}
	switch kind {
	case core.ReleasedLease:
		what := "holder " + id
		for _, h := range s.Holders {
			if h.ID == id {
				what = fmt.Sprintf("holder %s (slot %d, token %d)", id, h.Slot, h.Token)
			}
		}
		fmt.Fprintf(stdout, "released %s of %s; its process sees ErrLeaseLost at its next renewal\n", what, c.what(e))
	case core.ReleasedWaiter:
		fmt.Fprintf(stdout, "removed waiter %s from the queue of %s; its process will queue it again, at the back\n", id, c.what(e))
	default:
		return c.Fail(fmt.Errorf("%s has no live holder or waiter with id %s (already released or expired?)", c.what(e), id))
	}
	if admitted > 0 {
		fmt.Fprintf(stdout, "admitted %d waiting\n", admitted)
	}
	return exitOK
}

// resolveID returns the live holder or waiter id that arg names exactly or
// is the unique prefix of; an arg that names none is returned as is.
func resolveID(s *snapshot, arg string) (string, error) {
	var match []string
	for _, h := range s.Holders {
		if h.ID == arg {
			return arg, nil
		}
		if strings.HasPrefix(h.ID, arg) {
			match = append(match, h.ID)
		}
	}
	for _, w := range s.Waiters {
		if w.ID == arg {
			return arg, nil
		}
		if strings.HasPrefix(w.ID, arg) {
			match = append(match, w.ID)
		}
	}
	if len(match) > 1 {
		return "", fmt.Errorf("id prefix %q is ambiguous: %s", arg, strings.Join(match, ", "))
	}
	if len(match) == 1 {
		return match[0], nil
	}
	return arg, nil
}

func runPurge(args []string, stdout, stderr io.Writer) int {
	c := newCommand("purge", "NAME [flags]",
		"Deletes every key of semaphore NAME, the set-limit override included.\n"+
			"Holders lose their leases (they learn it at their next renewal), fair\n"+
			"waiters queue again, and the next client establishes the limit afresh.\n"+
			"It asks for confirmation on stdin unless --yes.", stdout, stderr)
	yes := c.FS.Bool("yes", false, "do not ask for confirmation")
	c.withKey()
	pos, code, stop := c.Parse(args, 1, "NAME")
	if stop {
		return code
	}
	ss, code, stop := c.openRead(pos[0], readOpts{})
	if stop {
		return code
	}
	defer ss.close()
	ctx, client, t, e, s := ss.ctx, ss.client, ss.t, ss.e, ss.s
	keys := e.Keys().List
	if c.member() != "" {
		// The sessions key is the whole family's: its other members'
		// waiters live by it.
		keys = append(append([]string(nil), keys[:core.KeySessions]...), keys[core.KeySessions+1:]...)
	}
	var present []string
	pipe := client.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return c.Fail(cli.ReachErr(t, err))
	}
	for i, k := range keys {
		if cmds[i].Val() > 0 {
			present = append(present, k)
		}
	}
	if len(present) == 0 {
		fmt.Fprintf(stdout, "nothing to purge: %s has no keys under prefix %q\n", c.what(e), c.Prefix)
		return exitOK
	}
	if !*yes {
		fmt.Fprintf(stderr, "purge %s: delete %d keys (%s)? %d holders lose their leases, %d waiters queue again. [y/N] ",
			c.what(e), len(present), strings.Join(present, " "), len(s.Holders), len(s.Waiters))
		answer, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return c.Fail(err)
		}
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			fmt.Fprintln(stderr)
			return c.Fail(errors.New("not confirmed: nothing deleted (use --yes to skip the question)"))
		}
	}
	n, err := client.Del(ctx, present...).Result()
	if err != nil {
		return c.Fail(cli.ReachErr(t, err))
	}
	fmt.Fprintf(stdout, "purged %s: deleted %d keys; %d holders lost their leases, %d waiters will queue again\n",
		c.what(e), n, len(s.Holders), len(s.Waiters))
	return exitOK
}
