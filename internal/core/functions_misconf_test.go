package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core/wire"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// The classifier over the replies a real redis-server gives to FUNCTION
// LOAD: a renamed-away FUNCTION and an ACL that denies it are refusals; a
// server out of memory, a read-only replica and a failed BGSAVE (MISCONF,
// whose message says writes "are disabled") are not.
func TestRefusedRealReplies(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	_, src := lua.Library()
	load := func(c *redis.Client) error {
		t.Helper()
		err := c.FunctionLoad(ctx, src).Err()
		if err == nil {
			t.Fatal("FUNCTION LOAD succeeded; the test wants it refused")
		}
		return err
	}
	check := func(what string, err error, want bool) {
		t.Helper()
		var re redis.Error
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v is not a Redis reply", what, err)
		}
		if got := wire.Refused(err); got != want {
			t.Errorf("%s: wire.Refused(%q) = %v, want %v", what, err, got, want)
		}
	}

	renamed := redistest.Start(t, "--rename-command", "FUNCTION", "")
	check("FUNCTION renamed away", load(renamed.Client(t)), true)

	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	opt := srv.Options()
	opt.Username, opt.Password = "nofn", "pw"
	user := redis.NewClient(opt)
	t.Cleanup(func() { _ = user.Close() })
	check("ACL without FUNCTION", load(user), true)

	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	check("maxmemory reached", load(admin), false)
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}

	// A replica of a port where nothing listens: read-only at once.
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.SlaveOf(ctx, "127.0.0.1", strconv.Itoa(port)).Err(); err != nil {
		t.Fatal(err)
	}
	check("read-only replica", load(admin), false)
	if err := admin.SlaveOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}

	misconf, _ := startMisconf(t, ctx)
	err = load(misconf)
	if !strings.HasPrefix(err.Error(), "MISCONF ") || !strings.Contains(err.Error(), "disabled") {
		t.Fatalf("FUNCTION LOAD after a failed BGSAVE: %v, want the MISCONF reply that says writes are disabled", err)
	}
	check("failed BGSAVE", err, false)
}

// startMisconf starts a redis-server that refuses writes with MISCONF: it
// has a save point and stop-writes-on-bgsave-error, and a BGSAVE failed
// because its working directory was removed (a file cannot be made in a
// removed directory, even by root). It returns a client of it and a
// function that clears the condition as an operator would: a writable
// directory (CONFIG SET dir), then a BGSAVE that succeeds.
func startMisconf(t *testing.T, ctx context.Context) (*redis.Client, func()) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rdb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t, "--dir", dir, "--save", "3600 1", "--stop-writes-on-bgsave-error", "yes",
		"--enable-protected-configs", "yes")
	c := srv.Client(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	bgsave := func(want string) {
		t.Helper()
		if err := c.BgSave(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// The server marks the save in progress before BGSAVE answers.
		var status string
		redistest.WaitFor(t, 10*time.Second, "the BGSAVE to end", func() (bool, error) {
			info, err := c.Info(ctx, "persistence").Result()
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_last_bgsave_status:"); ok {
					status = v
				}
			}
			return strings.Contains(info, "rdb_bgsave_in_progress:0"), nil
		})
		if status != want {
			t.Fatalf("BGSAVE ended with status %q, want %q", status, want)
		}
	}
	bgsave("err")
	clear := func() {
		t.Helper()
		if err := c.ConfigSet(ctx, "dir", t.TempDir()).Err(); err != nil {
			t.Fatal(err)
		}
		bgsave("ok")
		if err := c.Set(ctx, "misconf-cleared", 1, 0).Err(); err != nil {
			t.Fatalf("a write after a good BGSAVE: %v", err)
		}
	}
	return c, clear
}

// A FUNCTION LOAD that meets MISCONF (writes refused after a failed BGSAVE)
// is a failure to try again, not a refusal of FUNCTION: the engine stays on
// EVALSHA meanwhile ("pending", calls succeed), and once a BGSAVE succeeds
// it loads the library and runs its scripts with FCALL.
func TestLibraryAfterMisconf(t *testing.T) {
	ctx := redistest.Ctx(t, 60*time.Second)
	c, clear := startMisconf(t, ctx)
	e, err := New(Config{Client: c, Name: redistest.Name(t), Limit: 1, Prefix: DefaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	// Status writes nothing, so it runs under MISCONF; its success starts
	// the background load, which meets MISCONF.
	if _, err := e.Status(ctx); err != nil {
		t.Fatal(err)
	}
	e.WaitBackground() // the load has ended
	if m := e.ScriptMode(); m != "pending" {
		t.Fatalf("script mode %q after a FUNCTION LOAD answered MISCONF, want pending (tried again later)", m)
	}
	if _, err := e.Status(ctx); err != nil {
		t.Fatalf("a call while the library is not loaded: %v", err)
	}

	clear()
	// The next load would wait bounds.LibRetry after the failed one: not what
	// this test is about.
	e.lib.ForgetFailure()
	if _, err := e.Status(ctx); err != nil {
		t.Fatal(err)
	}
	e.WaitBackground()
	if m := e.ScriptMode(); m != "fcall" {
		t.Fatalf("script mode %q once writes are allowed again, want fcall", m)
	}
	name, _ := lua.Library()
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST %s: %v %v, want the library", name, libs, err)
	}
	if _, err := e.Status(ctx); err != nil {
		t.Fatalf("Status with FCALL_RO: %v", err)
	}
}
