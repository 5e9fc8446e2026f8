package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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

const setLimitAbout = `Sets the limit of NAME to N for every client at once, overriding the limit
each was built with. It never expires. Raising it admits fair waiters at
once; lowering it revokes no lease: new grants wait until fewer than N slots are held.
With --rate, also (or, without N, only) sets the rate: at most LIMIT slots
granted in any window of PER, for every client (SetRate); --rate none removes it.`

func runSetLimit(args []string, stdout, stderr io.Writer) int {
	c := newCommand("set-limit", "NAME [N] [flags]", setLimitAbout, stdout, stderr)
	rateFlag := c.FS.String("rate", "", "also set the rate to `LIMIT/PER` (e.g. 60/1m, 100/1s, 5/250ms; none: no rate bound)")
	c.withKey()
	pos, code, stop := c.ParseBetween(args, 1, 2, "NAME N (N may be left out with --rate)")
	if stop {
		return code
	}
	n, rate, setRate := 0, redsem.Rate{}, c.Given("rate")
	var err error
	if len(pos) == 2 {
		if n, err = strconv.Atoi(pos[1]); err != nil || n < 1 || n > core.MaxLimit {
			return c.UsageError("limit %q is not an integer in [1, %d]", pos[1], core.MaxLimit)
		}
	}
	if setRate {
		if rate, err = redsem.ParseRate(*rateFlag); err != nil {
			return c.UsageError("--rate: %v", err)
		}
		if rate, err = core.CheckRate("--rate", rate); err != nil {
			return c.UsageError("%v", err)
		}
	} else if n == 0 {
		return c.UsageError("missing arguments: want NAME N, or NAME --rate LIMIT/PER")
	}
	ss, code, stop := c.openRead(pos[0], 0)
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
		fmt.Fprintf(stdout, "rate of %s: %s -> %v (for every client, now; slots granted before still count in the window)\n",
			c.what(e), cmp.Or(before.Rate, "none"), rate)
	}
	if c.noShardRecord {
		fmt.Fprintf(stderr, "note: family %q has no shard record yet (no client used it): this was written for a family of one shard; "+
			"clients built with Shards > 1 will not see it\n", pos[0])
	}
	return exitOK
}

const releaseAbout = `Force-releases the holder with lease id ID (as shown by status; a unique
prefix is enough), with the script a client's Release runs (leaving no
tombstone), and admits the next waiters. The holder's process learns it at
its next renewal (within LeaseTTL/3): its lease reports ErrLeaseLost. ID
may also be a fair waiter's: it leaves the queue, and its process queues it
again at the back.`

func runRelease(args []string, stdout, stderr io.Writer) int {
	c := newCommand("release", "NAME ID [flags]", releaseAbout, stdout, stderr)
	c.withKey()
	return c.parseRead(args, 2, "NAME ID", func(pos []string, ss *session) int {
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
	})
}

// resolveID returns the live holder or waiter id that arg names exactly or
// is the unique prefix of; an arg that names none is returned as is.
func resolveID(s *snapshot, arg string) (string, error) {
	var ids, match []string
	for _, h := range s.Holders {
		ids = append(ids, h.ID)
	}
	for _, w := range s.Waiters {
		ids = append(ids, w.ID)
	}
	for _, id := range ids {
		if id == arg {
			return arg, nil
		}
		if strings.HasPrefix(id, arg) {
			match = append(match, id)
		}
	}
	switch len(match) {
	case 0:
		return arg, nil
	case 1:
		return match[0], nil
	}
	return "", fmt.Errorf("id prefix %q is ambiguous: %s", arg, strings.Join(match, ", "))
}

const purgeAbout = `Deletes every key of semaphore NAME, the set-limit override included.
Holders lose their leases (they learn it at their next renewal), fair
waiters queue again, and the next client establishes the limit afresh.
It asks for confirmation on stdin unless --yes.`

func runPurge(args []string, stdout, stderr io.Writer) int {
	c := newCommand("purge", "NAME [flags]", purgeAbout, stdout, stderr)
	yes := c.FS.Bool("yes", false, "do not ask for confirmation")
	c.withKey()
	return c.parseRead(args, 1, "NAME", func(_ []string, ss *session) int {
		client, t, e, s := ss.client, ss.t, ss.e, ss.s
		present := s.present
		if c.key != "" {
			// The sessions key is the whole family's: its other members'
			// waiters live by it.
			sessions := e.Keys().List[core.KeySessions]
			present = slices.DeleteFunc(present, func(k string) bool { return k == sessions })
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
		// Not ss.ctx: the question may have taken longer than cli.OpTimeout.
		ctx, cancel := cli.OpContext(context.Background())
		defer cancel()
		var requeue map[string]string
		if c.key != "" && len(s.Waiters) > 0 {
			// The family's sessions live on, so its processes would not
			// notice that their waiters' entries are gone: each is told to
			// queue again, as release tells a waiter it removed.
			var err error
			if requeue, err = waiterSessions(ctx, client, e.Keys(), s.Waiters); err != nil {
				return c.Fail(cli.ReachErr(t, err))
			}
		}
		n, err := client.Del(ctx, present...).Result()
		if err != nil {
			return c.Fail(cli.ReachErr(t, err))
		}
		for id, sid := range requeue {
			if err := publish(ctx, client, e.Keys().Chan+":s:"+sid, "r "+id); err != nil {
				return c.Fail(cli.ReachErr(t, err))
			}
		}
		fmt.Fprintf(stdout, "purged %s: deleted %d keys; %d holders lost their leases, %d waiters will queue again\n",
			c.what(e), n, len(s.Holders), len(s.Waiters))
		return exitOK
	})
}

// waiterSessions returns the session of each of waiters (fair: read from
// their queue records in the semaphore's meta hash), by waiter id.
func waiterSessions(ctx context.Context, client redis.UniversalClient, k core.Keys, waiters []waiterInfo) (map[string]string, error) {
	ids := make([]string, len(waiters))
	for i, w := range waiters {
		ids[i] = w.ID
	}
	recs, err := client.HMGet(ctx, k.List[core.KeyMeta], ids...).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ids))
	for i, r := range recs {
		// "W|session|weight|lease_ms|owner" (lua/lib_args.lua)
		if rec, ok := r.(string); ok {
			if f := strings.SplitN(rec, "|", 3); len(f) == 3 && f[0] == "W" {
				out[ids[i]] = f[1]
			}
		}
	}
	return out, nil
}

// publish sends msg on channel as the semaphores do: PUBLISH, or SPUBLISH
// on a cluster.
func publish(ctx context.Context, client redis.UniversalClient, channel, msg string) error {
	if _, ok := client.(*redis.ClusterClient); ok {
		return client.SPublish(ctx, channel, msg).Err()
	}
	return client.Publish(ctx, channel, msg).Err()
}
