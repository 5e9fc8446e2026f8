package lua_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// An acquire that arrives after its own undo (a request delayed in flight,
// its caller gone) grants nothing and queues nothing: the undo's
// cancellation record wins, and every slot stays free for others.
func TestUndoBeforeAcquireWins(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.Release, k, 2, "late", "undo", 5000); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"try", "queue"} {
		r, err := run(ctx, t, c, lua.Acquire, k, 2, "late", 1, 5000, mode, "sess1", 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != int64(-2) {
			t.Fatalf("%s acquire after its undo: %v, want {-2, now}", mode, r)
		}
	}
	for _, id := range []string{"a", "b"} {
		r, err := run(ctx, t, c, lua.Acquire, k, 2, id, 1, 5000, "try", "-", 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != int64(1) {
			t.Fatalf("acquire %s: %v: a slot of limit 2 is taken by the cancelled acquire", id, r)
		}
	}
}

// A session whose deadline has passed stays dead: a heartbeat of an old
// session reports it gone (its process then queues its waiters again, as
// prune evicts them), instead of bringing it back.
func TestDeadSessionStaysDead(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	r, err := run(ctx, t, c, lua.Heartbeat, k, 2, "sess1", 1, "new") // lives 1 ms
	if err != nil {
		t.Fatal(err)
	}
	if r[1] != int64(1) {
		t.Fatalf("first heartbeat %v, want alive", r)
	}
	born := r[0].(int64)
	redistest.WaitFor(t, 5*time.Second, "the session's deadline to pass", func() (bool, error) {
		now, err := c.Time(ctx).Result()
		return now.UnixMilli() > born+1, err
	})
	r, err = run(ctx, t, c, lua.Heartbeat, k, 2, "sess1", 1000, "old")
	if err != nil {
		t.Fatal(err)
	}
	if r[1] != int64(0) {
		t.Fatalf("heartbeat of a session dead since %d: %v, want alive 0", born+1, r)
	}
}

// A release publishes a freed-slot notice only while unfair waiters want
// one: none when nobody waits, one when a waiter asked. Counted with INFO
// commandstats on a server of its own (PUBLISH from scripts included).
func TestFreeNoticeOnlyWhenWanted(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Start(t).Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	acquire := func(id, mode string) []any {
		t.Helper()
		r, err := run(ctx, t, c, lua.Acquire, k, 1, id, 1, 5000, mode, "-", 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	release := func(id string) int {
		t.Helper()
		before := publishes(t, ctx, c)
		if _, err := run(ctx, t, c, lua.Release, k, 1, id, "owner", 5000); err != nil {
			t.Fatal(err)
		}
		return publishes(t, ctx, c) - before
	}
	if r := acquire("a", "try"); r[0] != int64(1) {
		t.Fatalf("acquire a: %v", r)
	}
	if n := release("a"); n != 0 {
		t.Fatalf("a release nobody waits for published %d messages, want 0", n)
	}
	if r := acquire("b", "try"); r[0] != int64(1) {
		t.Fatalf("acquire b: %v", r)
	}
	if r := acquire("c", "wait"); r[0] != int64(0) {
		t.Fatalf("waiting acquire c: %v, want not granted", r)
	}
	if n := release("b"); n != 1 {
		t.Fatalf("a release with a waiter that wants notices published %d messages, want 1", n)
	}
}

// publishes returns how many PUBLISH calls the server has run.
func publishes(t *testing.T, ctx context.Context, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_publish:calls=")
		if ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// An acquire request that runs after its caller's refuse_after (a request
// held in the network past its deadline) writes nothing, in either mode,
// even with no cancellation record; one within its bound is granted.
func TestAcquireAfterRefuseAfterWritesNothing(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	for _, mode := range []string{"try", "queue"} {
		r, err := run(ctx, t, c, lua.Acquire, k, 1, "late-"+mode, 1, 5000, mode, "sess1", 1000, "test", 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != int64(-2) {
			t.Fatalf("%s acquire after refuse_after: %v, want {-2, now}", mode, r)
		}
	}
	if n, err := c.Exists(ctx, k.List...).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys written by refused requests (err %v)", n, err)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	r, err := run(ctx, t, c, lua.Acquire, k, 1, "on-time", 1, 5000, "try", "-", 1000, "test", 0, now.UnixMilli()+60000)
	if err != nil {
		t.Fatal(err)
	}
	if r[0] != int64(1) {
		t.Fatalf("acquire within refuse_after: %v, want granted", r)
	}
}
