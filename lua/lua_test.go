package lua_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

func run(ctx context.Context, t *testing.T, c *redis.Client, s lua.Script, k core.Keys, args ...any) ([]any, error) {
	t.Helper()
	return core.Script(s).Run(ctx, c, k.List, append([]any{k.Chan, "PUBLISH"}, args...)...).Slice()
}

// A retried acquire (same id: the reply was lost and go-redis sent it
// again) takes one slot, not two, and returns the same slot and token.
func TestAcquireIsIdempotentPerID(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	first, err := run(ctx, t, c, lua.Acquire, k, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	again, err := run(ctx, t, c, lua.Acquire, k, 2, "id-1", 1, 5000, "try", "-", 1000, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	if first[0] != int64(1) || again[0] != int64(1) || first[2] != again[2] || first[4] != again[4] {
		t.Fatalf("first %v, retry %v: want the same grant", first, again)
	}
	if r, err := core.Inspect(ctx, c, k); err != nil || r.Holders != 1 {
		t.Fatalf("%+v (%v) after a retried acquire, want 1 holder", r, err)
	}
	// Queue mode: the same waiter id queues once.
	for i := 0; i < 3; i++ {
		if _, err := run(ctx, t, c, lua.Acquire, k, 2, "id-x", 1, 5000, "try", "-", 1000, "test", 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := run(ctx, t, c, lua.Heartbeat, k, 2, "sess1", 60000, "new"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, err := run(ctx, t, c, lua.Acquire, k, 2, "w-1", 1, 5000, "queue", "sess1", 1000, "test", 0)
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != int64(0) || r[3] != int64(0) {
			t.Fatalf("queue attempt %d: %v, want queued at position 0", i, r)
		}
	}
	if r, err := core.Inspect(ctx, c, k); err != nil || r.Queue != 1 || r.Waiters != 1 {
		t.Fatalf("%+v (%v), want 1 queue entry", r, err)
	}
}

// Bad arguments are refused with an error before any write.
func TestBadArgumentsWriteNothing(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	cases := map[string][]any{
		"zero limit":        {0, "id", 1, 1000, "try", "-", 1000, "", 0},
		"float limit":       {1.5, "id", 1, 1000, "try", "-", 1000, "", 0},
		"empty id":          {1, "", 1, 1000, "try", "-", 1000, "", 0},
		"sentinel id":       {1, "~", 1, 1000, "try", "-", 1000, "", 0},
		"meta field id":     {1, "_limit", 1, 1000, "try", "-", 1000, "", 0},
		"zero weight":       {1, "id", 0, 1000, "try", "-", 1000, "", 0},
		"zero lease":        {1, "id", 1, 0, "try", "-", 1000, "", 0},
		"bad mode":          {1, "id", 1, 1000, "grab", "-", 1000, "", 0},
		"no session":        {1, "id", 1, 1000, "queue", "", 1000, "", 0},
		"bad session":       {1, "id", 1, 1000, "queue", "a|b", 1000, "", 0},
		"zero want":         {1, "id", 1, 1000, "wait", "-", 0, "", 0},
		"bad owner":         {1, "id", 1, 1000, "try", "-", 1000, "a|b", 0},
		"bad max queue":     {1, "id", 1, 1000, "queue", "s", 1000, "", -1},
		"rate limit 0":      {"1:0:1000", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate per 0":        {"1:5:0", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate negative":     {"1:-5:1000", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate float":        {"1:5:1.5", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate huge":         {"1:5:99999999999999", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate one part":     {"1:5", "id", 1, 1000, "try", "-", 1000, "", 0},
		"rate limit 2^20+1": {"1:1048577:1000", "id", 1, 1000, "try", "-", 1000, "", 0},
	}
	for desc, args := range cases {
		_, err := run(ctx, t, c, lua.Acquire, k, args...)
		if err == nil || !strings.Contains(err.Error(), "redsem:") {
			t.Errorf("%s: got %v, want a redsem error", desc, err)
		}
	}
	for name, s := range map[string]lua.Script{"renew": lua.Renew, "release": lua.Release} {
		if _, err := run(ctx, t, c, s, k, 1, ""); err == nil {
			t.Errorf("%s with empty id: no error", name)
		}
	}
	if _, err := run(ctx, t, c, lua.Release, k, 1, "id", "holder", 1000); err == nil {
		t.Error("release with a bad mode: no error")
	}
	if _, err := run(ctx, t, c, lua.SetLimit, k, 0, "call-1"); err == nil {
		t.Error("setlimit 0: no error")
	}
	if n := c.Exists(ctx, k.List...).Val(); n != 0 {
		t.Fatalf("%d keys written by refused calls", n)
	}
}

// recordLife is lib_args.lua's TOMB_MS: how long release, cancellation and
// SetLimit call records live.
const recordLife = 15 * time.Second

// Every key written gets a TTL, except the SetLimit override.
func TestEveryKeyExpires(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	if _, err := run(ctx, t, c, lua.Acquire, k, 1, "h", 1, 3000, "try", "-", 1000, "test", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.Heartbeat, k, 1, "s1", 3000, "new"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"w1", "w2"} {
		if _, err := run(ctx, t, c, lua.Acquire, k, 1, w, 1, 3000, "queue", "s1", 1000, "test", 0); err != nil {
			t.Fatal(err)
		}
	}
	// The holder's own release leaves a tombstone and admits w1; w2 waits.
	if _, err := run(ctx, t, c, lua.Release, k, 1, "h", "owner", 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, t, c, lua.SetLimit, k, 1, "call-2"); err != nil {
		t.Fatal(err)
	}
	for i, key := range k.List {
		ttl := c.PTTL(ctx, key).Val()
		switch {
		case i == core.KeyRate || i == core.KeyWindow:
			if ttl != -2 {
				t.Errorf("%s exists (TTL %v) without a rate, want no key", key, ttl)
			}
		case i == core.KeyOverride:
			if ttl != -1 {
				t.Errorf("override %s has TTL %v, want none", key, ttl)
			}
		case ttl == -2:
			t.Errorf("%s missing", key)
		case ttl < 0 || ttl > 2*recordLife+2*time.Second:
			// SetLimit's call record lives recordLife and keeps the keys
			// alive as long (extend: up to twice the time ahead, plus 1 s).
			t.Errorf("%s has TTL %v, want (0, 2 x 15s + 2s]", key, ttl)
		}
	}
}

// All keys and channels of one semaphore share one non-empty hash tag, for
// any name, including names with braces.
func TestOneHashTagPerSemaphore(t *testing.T) {
	tag := func(key string) string {
		i := strings.IndexByte(key, '{')
		if i < 0 {
			return key
		}
		j := strings.IndexByte(key[i+1:], '}')
		if j <= 0 { // no closing brace, or "{}": Redis hashes the whole key
			return key
		}
		return key[i+1 : i+1+j]
	}
	names := []string{"db", "a{b}c", "}x{", "{}", "{", "}", "%7B", "a b:c", "ünï"}
	seen := map[string]string{}
	for _, n := range names {
		k := core.KeysFor("redsem", n)
		want := tag(k.List[0])
		if want == k.List[0] {
			t.Fatalf("%q: key %q has no usable hash tag", n, k.List[0])
		}
		for _, key := range append(append([]string{}, k.List...), k.Chan, k.Free) {
			if got := tag(key); got != want {
				t.Errorf("%q: key %q tag %q, want %q", n, key, got, want)
			}
		}
		if other, dup := seen[want]; dup {
			t.Errorf("names %q and %q share tag %q", n, other, want)
		}
		seen[want] = n
	}
}

// Every script loads into a real Redis under the name Hash gives it (the
// name EVALSHA and SCRIPT EXISTS use), and the engine runs that same text.
func TestScriptsLoadUnderTheirHash(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	for _, s := range lua.Scripts() {
		sha, err := c.ScriptLoad(ctx, s.Source()).Result()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if sha != s.Hash() || core.Script(s).Hash() != sha {
			t.Errorf("%s: Redis names it %s, Hash %s, engine %s", s, sha, s.Hash(), core.Script(s).Hash())
		}
		if !strings.HasSuffix(s.String(), ".lua") {
			t.Errorf("script %d: String %q", s, s.String())
		}
	}
	if bad := lua.Script(0); bad.Source() != "" || bad.Hash() != "" || bad.String() != "Script(0)" {
		t.Errorf("Script(0): %q %q %q, want empty and a plain name", bad.Source(), bad.Hash(), bad.String())
	}
}

// A semaphore's meta hash leaves Redis's listpack encoding (where every
// field read or written scans the hash from the front) once it holds more
// than a few dozen fields, tombstones mostly, and stays a hash table; a
// small one stays a compact listpack. Without lib_prune.lua's keep_hashed, 40
// releases' tombstones left a listpack of 50 fields (the default limit is
// 512), whose scans were half of the server's instructions per call.
func TestMetaLeavesListpackWhenLarge(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	small := core.KeysFor("redsem", redistest.Name(t)+"-small")
	large := core.KeysFor("redsem", redistest.Name(t)+"-large")
	cycle := func(k core.Keys, id string) {
		t.Helper()
		if r, err := run(ctx, t, c, lua.Acquire, k, 2, id, 1, 5000, "try", "-", 1000, "test", 0); err != nil || r[0] != int64(1) {
			t.Fatalf("acquire %s: %v %v", id, r, err)
		}
		if _, err := run(ctx, t, c, lua.Release, k, 2, id, "owner", 5000); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
	for i := 0; i < 40; i++ {
		cycle(large, "id-"+strconv.Itoa(i))
	}
	cycle(small, "id-0")
	// The check runs with prune, at most every 100 ms: one more cycle
	// once the server's clock has passed the next prune time of each.
	for _, k := range []core.Keys{large, small} {
		if err := waitPruneDue(ctx, c, k, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		cycle(k, "last")
	}
	for _, x := range []struct {
		k    core.Keys
		want string
	}{{large, "hashtable"}, {small, "listpack"}} {
		k, want := x.k, x.want
		enc, err := c.ObjectEncoding(ctx, k.List[core.KeyMeta]).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := c.HLen(ctx, k.List[core.KeyMeta]).Val()
		if enc != want {
			t.Errorf("meta of %d fields is a %s, want a %s", n, enc, want)
		}
	}
}

// A Release that admits the head waiter hands it the lowest free slots:
// the one just freed when the free set held none (kept within the call, not
// written and popped again), and the free set's with it when it held some.
// Either way the free set ends holding exactly the slots nobody holds.
func TestHandoffTakesLowestFreeSlots(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	c := redistest.Client(t)
	k := core.KeysFor("redsem", redistest.Name(t))
	call := func(s lua.Script, args ...any) []any {
		t.Helper()
		r, err := run(ctx, t, c, s, k, args...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	acquire := func(id string, n int) []any {
		t.Helper()
		return call(lua.Acquire, 3, id, n, 60000, "queue", "sess", 0, "t", 0)
	}
	free := func() []string {
		t.Helper()
		v, err := c.ZRange(ctx, k.List[core.KeyFree], 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v[:len(v)-1] // the sentinel
	}
	call(lua.Heartbeat, 3, "sess", 60000, "new")
	for _, id := range []string{"a", "b", "c"} { // slots 0, 1, 2
		if r := acquire(id, 1); r[0] != int64(1) {
			t.Fatalf("acquire %s: %v", id, r)
		}
	}
	// The free set holds none: b's slot goes to w1 within the release.
	if r := acquire("w1", 1); r[0] != int64(0) {
		t.Fatalf("w1 not queued: %v", r)
	}
	if r := call(lua.Release, 3, "b", "owner", 5000); len(r) != 6 || r[2] != "w1" || r[5] != "1" {
		t.Fatalf("release b: %v, want w1 granted slot 1", r)
	}
	if f := free(); len(f) != 0 {
		t.Fatalf("free set %v after the handoff, want none", f)
	}
	// a's slot 0 goes to the free set (nobody waits); w2 wants 2 slots and
	// queues; c's release frees 2 and admits w2 with 0 and 2.
	call(lua.Release, 3, "a", "owner", 5000)
	if f := free(); len(f) != 1 || f[0] != "0" {
		t.Fatalf("free set %v, want [0]", f)
	}
	if r := acquire("w2", 2); r[0] != int64(0) {
		t.Fatalf("w2 not queued: %v", r)
	}
	if r := call(lua.Release, 3, "c", "owner", 5000); len(r) != 6 || r[2] != "w2" || r[5] != "0,2" {
		t.Fatalf("release c: %v, want w2 granted slots 0,2", r)
	}
	if f := free(); len(f) != 0 {
		t.Fatalf("free set %v after the second handoff, want none", f)
	}
}

// Every lib_*.lua file is part of the lib that each semaphore script
// starts with (lua.go lists them: a file added here and not there would
// be left out).
func TestLibFilesAllPrepended(t *testing.T) {
	files, err := filepath.Glob("lib_*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no lib_*.lua files: %v", err)
	}
	src := lua.Acquire.Source()
	_, fn := lua.Library()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(src, string(b)) || !strings.Contains(fn, string(b)) {
			t.Errorf("%s is not part of the lib (lua.go's libFiles)", f)
		}
	}
}
