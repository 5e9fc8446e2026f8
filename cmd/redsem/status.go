package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redsem/redsem/cmd/redsem/internal/cli"
	"github.com/redsem/redsem/internal/core"
)

const statusAbout = `Shows the live holders (id, slot, fencing token, age, deadline), the fair
queue (position, time to eviction), the limit in force and warnings. For
the name of a keyed family (without --key): its total, slots held and
queued, and its busiest members.`

func runStatus(args []string, stdout, stderr io.Writer) int {
	c := newCommand("status", "NAME [flags]", statusAbout, stdout, stderr)
	asJSON := c.FS.Bool("json", false, "print one JSON object instead of text")
	leaseTTL := c.FS.Duration("lease-ttl", 0, "the clients' LeaseTTL, to check holders against 0.8 x LeaseTTL (not stored in Redis)")
	top := c.FS.Int("top", 10, "without --key: list at most this many of family NAME's members, busiest first")
	c.withKey()
	pos, code, stop := c.Parse(args, 1, "NAME")
	if stop {
		return code
	}
	if *top < 0 {
		return c.UsageError("--top must not be negative")
	}
	ss, code, stop := c.openRead(pos[0], *leaseTTL)
	if stop {
		return code
	}
	defer ss.close()
	s := ss.s
	if c.key == "" && *top > 0 {
		if err := ss.readFamily(ss.ctx, s, *top); err != nil {
			return c.Fail(cli.ReachErr(ss.t, err))
		}
	}
	if *asJSON {
		return c.printJSON(s)
	}
	render(stdout, s)
	return exitOK
}

func (c *command) printJSON(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return c.Fail(err)
	}
	fmt.Fprintf(c.Stdout, "%s\n", b)
	return exitOK
}

// render writes s as text.
func render(w io.Writer, s *snapshot) {
	at := s.ServerTime.Format("2006-01-02 15:04:05.000 MST")
	switch {
	case s.Kind == kindFamily:
		fmt.Fprintf(w, "family %q (prefix %q) at %s (Redis server clock)\n", s.Name, s.Prefix, at)
		if !s.Live {
			fmt.Fprintf(w, "state:   idle: no member has keys in Redis, nothing held or queued\n")
		}
		renderMembers(w, s)
		renderUnfair(w, s)
		renderNotes(w, s)
		return
	case s.Family != "":
		fmt.Fprintf(w, "member %q of family %q (prefix %q) at %s (Redis server clock)\n", s.Name, s.Family, s.Prefix, at)
	default:
		fmt.Fprintf(w, "semaphore %q (prefix %q) at %s (Redis server clock)\n", s.Name, s.Prefix, at)
	}
	defer renderMembers(w, s)
	switch {
	case s.Limit == nil:
		fmt.Fprintf(w, "limit:   unknown: idle, no live state (the first client to acquire establishes its limit)\n")
	case s.LimitSource == "set-limit":
		fmt.Fprintf(w, "limit:   %d (set with set-limit; never expires)\n", *s.Limit)
	default:
		fmt.Fprintf(w, "limit:   %d (established by live clients)\n", *s.Limit)
	}
	switch {
	case s.Rate != "" && s.SetRate != "":
		fmt.Fprintf(w, "rate:    %s (set with set-limit --rate; never expires; %d granted in the window ending now)\n", s.Rate, s.RateGranted)
	case s.Rate != "":
		fmt.Fprintf(w, "rate:    %s (%d granted in the window ending now)\n", s.Rate, s.RateGranted)
	}
	if !s.Live && s.Limit != nil {
		fmt.Fprintf(w, "state:   idle: no holders, no waiters\n")
	}
	if s.Limit != nil {
		fmt.Fprintf(w, "holders: %d, holding %d of %d slots\n", len(s.Holders), s.slotsHeld(), *s.Limit)
	} else {
		fmt.Fprintf(w, "holders: %d, holding %d slots\n", len(s.Holders), s.slotsHeld())
	}
	if len(s.Holders) > 0 {
		rows := []string{"SLOT\tTOKEN\tAGE\tEXPIRES IN\tDEADLINE\tOWNER\tID"}
		for _, h := range s.Holders {
			rows = append(rows, fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s\t%s", slotList(h.Slots, h.Slot), h.Token, atLeast(h.MinAgeMs),
				fmtMs(h.ExpiresInMs), h.Deadline.Format("15:04:05.000"), h.Owner, h.ID))
		}
		table(w, rows)
	}
	fmt.Fprintf(w, "waiters: %d (fair queue, head first; unfair waiters retry and are not stored in Redis)\n", len(s.Waiters))
	if len(s.Waiters) > 0 {
		rows := []string{"POS\tSLOTS\tWAITING\tEVICTED IN\tOWNER\tID"}
		for _, q := range s.Waiters {
			rows = append(rows, fmt.Sprintf("%d\t%d\t%s\t%s\t%s\t%s", q.Position, q.Weight, atLeast(q.SeenForMs), fmtMs(q.EvictInMs), q.Owner, q.ID))
		}
		table(w, rows)
	}
	renderUnfair(w, s)
	renderNotes(w, s)
}

// renderUnfair says that unfair waiters wait, if they left their sign.
func renderUnfair(w io.Writer, s *snapshot) {
	if t := s.UnfairWaitersUntil; t != nil {
		fmt.Fprintf(w, "unfair waiters are retrying: they asked for freed-slot notices until %s (Redis stores no unfair waiter: how many is unknown)\n",
			t.Format("15:04:05.000"))
	}
}

// renderNotes writes s's warnings and notes.
func renderNotes(w io.Writer, s *snapshot) {
	if len(s.Warnings) > 0 {
		fmt.Fprintln(w, "warnings:")
		for _, x := range s.Warnings {
			fmt.Fprintf(w, "  ! %s\n", x)
		}
	}
	if len(s.Notes) > 0 || len(s.Holders) > 0 || len(s.Waiters) > 0 {
		fmt.Fprintln(w, "notes:")
		for _, x := range s.Notes {
			fmt.Fprintf(w, "  - %s\n", x)
		}
		if len(s.Holders) > 0 {
			fmt.Fprintln(w, "  - AGE is a lower bound derived from the fencing token, which is never below the server clock in µs at the grant")
		}
		if len(s.Waiters) > 0 {
			fmt.Fprintln(w, "  - the queue stores arrival order, not time: WAITING is how long watch has seen a waiter (status cannot tell)")
		}
	}
}

const watchAbout = `Shows status NAME (a semaphore, a member with --key, or a keyed family),
refreshed every --interval until Ctrl-C (or --count refreshes). It also
tracks what one reading cannot: how long the semaphore (or the family's
total) has stayed full, and how long each waiter has waited.`

func runWatch(args []string, stdout, stderr io.Writer) int {
	c := newCommand("watch", "NAME [flags]", watchAbout, stdout, stderr)
	asJSON := c.FS.Bool("json", false, "print one JSON object per refresh (one per line)")
	leaseTTL := c.FS.Duration("lease-ttl", 0, "the clients' LeaseTTL, to check holders against 0.8 x LeaseTTL (not stored in Redis)")
	interval := c.FS.Duration("interval", time.Second, "time between refreshes")
	count := c.FS.Int("count", 0, "stop after this many refreshes (0: until Ctrl-C)")
	alwaysFull := c.FS.Duration("full-after", 30*time.Second, "warn 'always full' once the semaphore (or the family's total) has been full at every refresh for this long")
	top := c.FS.Int("top", 10, "without --key: list at most this many of family NAME's members, busiest first")
	c.withKey()
	pos, code, stop := c.Parse(args, 1, "NAME")
	if stop {
		return code
	}
	if *interval <= 0 || *count < 0 || *alwaysFull <= 0 {
		return c.UsageError("--interval and --full-after must be positive and --count not negative")
	}
	if *top < 0 {
		return c.UsageError("--top must not be negative")
	}
	ss, code, stop := c.open(pos[0])
	if stop {
		return code
	}
	defer ss.close()
	ctx, stopSignals := cli.InterruptContext()
	defer stopSignals()

	clear := cli.IsTerminal(stdout) && !*asJSON
	var fullSince time.Time // server time of the first reading of the current full run
	firstSeen := map[string]time.Time{}
	failed := false
	for n := 0; *count == 0 || n < *count; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return exitOK
			case <-time.After(*interval):
			}
		}
		rctx, cancel := cli.OpContext(ctx)
		s, err := ss.read(rctx, *leaseTTL)
		// NAME may be a keyed family (read as status does), unless it is a
		// semaphore with state of its own: then each refresh spares the
		// SCAN that finds a family's members.
		if err == nil && c.key == "" && *top > 0 && !s.Live && s.Limit == nil {
			err = ss.readFamily(rctx, s, *top)
		}
		cancel()
		if ctx.Err() != nil {
			return exitOK
		}
		if err != nil {
			failed = true
			fmt.Fprintf(stderr, "redsem watch: %s\n", cli.OneLine(cli.ReachErr(ss.t, err).Error()))
			continue
		}
		failed = false
		// What one reading cannot tell.
		if s.full() {
			if fullSince.IsZero() {
				fullSince = s.ServerTime
			}
			if d := s.ServerTime.Sub(fullSince); d >= *alwaysFull {
				what := "the limit"
				if s.Kind == kindFamily {
					what = "the family's total"
				}
				s.warn("always full: full at every refresh for %s: %s is too low for the load, or holders leak (see docs/operations.md)", fmtMs(d.Milliseconds()), what)
			}
		} else {
			fullSince = time.Time{}
		}
		seen := map[string]time.Time{}
		for i := range s.Waiters {
			q := &s.Waiters[i]
			first, ok := firstSeen[q.ID]
			if !ok {
				first = s.ServerTime
			}
			seen[q.ID] = first
			d := s.ServerTime.Sub(first).Milliseconds()
			q.SeenForMs = &d
		}
		firstSeen = seen
		if *asJSON {
			if code := c.printJSON(s); code != exitOK {
				return code
			}
			continue
		}
		if clear {
			fmt.Fprint(stdout, "\033[H\033[2J")
		} else if n > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "every %s, Ctrl-C to stop\n", *interval)
		render(stdout, s)
	}
	if failed {
		return exitError
	}
	return exitOK
}

// renderMembers lists a family's busiest members, if status found any.
func renderMembers(w io.Writer, s *snapshot) {
	if t := s.Total; t != nil {
		bound := "none (SetTotal 0)"
		if t.Total > 0 {
			bound = fmt.Sprint(t.Total)
		}
		fmt.Fprintf(w, "family total: %s; %d slots held in all members, %d queued in fair queues\n", bound, t.SlotsHeld, t.Queued)
	}
	if s.MemberCount == 0 {
		return
	}
	more := ""
	if s.MemberCount >= core.MaxMembers {
		more = " or more"
	}
	sums := ""
	if s.MembersSlotsHeld != nil && s.MembersQueued != nil {
		sums = fmt.Sprintf(", %d slots held and %d queued in all", *s.MembersSlotsHeld, *s.MembersQueued)
	}
	fmt.Fprintf(w, "family members: %d%s with keys in Redis%s; the busiest %d:\n", s.MemberCount, more, sums, len(s.Members))
	rows := []string{"KEY\tHELD\tLIMIT\tQUEUED"}
	for _, m := range s.Members {
		limit := "?"
		if m.Limit != nil {
			limit = strconv.Itoa(*m.Limit)
		}
		rows = append(rows, fmt.Sprintf("%s\t%d\t%s\t%d", m.Key, m.Held, limit, m.Queued))
	}
	table(w, rows)
	fmt.Fprintf(w, "  (HELD counts expired holders until a script removes them; 'redsem status %s --key KEY' shows one member)\n", s.Name)
}

// table writes rows, the first of them the header, indented by two spaces,
// with their tab-separated cells in aligned columns.
func table(w io.Writer, rows []string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+r)
	}
	tw.Flush()
}

// atLeast shows a lower bound of milliseconds: ">=1.5s", or "?" for none.
func atLeast(ms *int64) string {
	if ms == nil {
		return "?"
	}
	return ">=" + fmtMs(*ms)
}

// slotList shows a lease's slots: "3", or "0,1,2" for a weighted lease.
func slotList(slots []int, first int) string {
	if len(slots) == 0 {
		return strconv.Itoa(first)
	}
	parts := make([]string, len(slots))
	for i, x := range slots {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}
