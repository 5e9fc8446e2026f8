package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// waiters runs Acquire on each semaphore in its own goroutine; the
// returned stop cancels them and waits until every one has returned
// (releasing what any of them got).
func waiters(ctx context.Context, sems ...redsem.Semaphore) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, s := range sems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l, err := s.Acquire(wctx); err == nil {
				_ = l.Release(context.Background())
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// serverTime matches the Redis server time in the header line of status
// and watch, which differs between two readings.
var serverTime = regexp.MustCompile(`at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \(Redis server clock\)`)

// TestWatchFamily: watch FAMILY shows a busy family as status FAMILY does
// (its total, slots held, queue, busiest members, live), in text and JSON;
// it used to show an idle semaphore ("limit: unknown: idle", "holders: 0";
// "live":false) while status showed 2 held and 4 queued. (Issue 43, 6.)
func TestWatchFamily(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	fam := redistest.Name(t)
	f, err := fair.NewFamily(redistest.Client(t), fam, 3, fair.FamilyOptions{Total: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	get := func(key string) *fair.Semaphore {
		s, err := f.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := get("a"), get("b")
	// One holder in each member fills the total; two waiters in each
	// member queue behind it (their members have room, the total has none).
	for _, s := range []*fair.Semaphore{a, b} {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
	}
	stop := waiters(ctx, a, a, b, b)
	defer stop()
	waitFor(t, 10*time.Second, "2 held and 4 queued in the family", func() bool {
		st, err := f.Status(ctx)
		return err == nil && st.Held == 2 && st.Waiting == 4
	})

	code, out, errs := runCmd(t, "watch", fam, "--count", "1")
	if code != exitOK || errs != "" {
		t.Fatalf("watch %s: exit %d, stderr %q", fam, code, errs)
	}
	t.Logf("watch %s:\n%s", fam, out)
	if strings.Contains(out, "idle, no live state") || strings.Contains(out, "holders: 0") {
		t.Errorf("watch shows a busy family as an idle semaphore:\n%s", out)
	}
	for _, want := range []string{
		`family "` + fam + `" (prefix "redsem")`,
		"family total: 2; 2 slots held in all members, 4 queued in fair queues",
		"family members: 2 with keys in Redis, 2 slots held and 4 queued in all; the busiest 2:",
		"full: the family's total of 2 is all held",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("watch %s lacks %q", fam, want)
		}
	}
	member := regexp.MustCompile(`(?m)^  ([ab])\s+1\s+3\s+2$`)
	if n := len(member.FindAllString(out, -1)); n != 2 {
		t.Errorf("watch %s: %d member rows (KEY HELD LIMIT QUEUED) 'a|b 1 3 2', want 2", fam, n)
	}
	if strings.Contains(out, "unfair waiters are retrying") {
		t.Errorf("watch %s reports unfair waiters in a fair family:\n%s", fam, out)
	}
	// The same view as status, but for the refresh line and the clock.
	_, st, _ := runCmd(t, "status", fam)
	same := func(s string) string {
		s = strings.TrimPrefix(s, "every 1s, Ctrl-C to stop\n")
		return serverTime.ReplaceAllString(s, "at TIME")
	}
	if same(out) != same(st) {
		t.Errorf("watch and status of the family differ:\nwatch:\n%s\nstatus:\n%s", out, st)
	}

	code, out, _ = runCmd(t, "watch", fam, "--count", "2", "--interval", "10ms", "--json")
	if code != exitOK {
		t.Fatalf("watch --json: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d JSON lines, want 2:\n%s", len(lines), out)
	}
	_, st, _ = runCmd(t, "status", fam, "--json")
	for _, line := range append(lines, st) {
		var s struct {
			Kind  string `json:"kind"`
			Live  bool   `json:"live"`
			Total *struct {
				Total     int `json:"total"`
				SlotsHeld int `json:"slots_held"`
				Queued    int `json:"queued"`
			} `json:"total"`
			Members          []core.Member `json:"members"`
			MemberCount      int           `json:"member_count"`
			MembersSlotsHeld *int          `json:"members_slots_held"`
			MembersQueued    *int          `json:"members_queued"`
			UnfairUntil      *time.Time    `json:"unfair_waiters_until"`
		}
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("bad JSON %q: %v", line, err)
		}
		if s.Kind != "family" || !s.Live || s.Total == nil || s.Total.Total != 2 || s.Total.SlotsHeld != 2 || s.Total.Queued != 4 ||
			s.MemberCount != 2 || len(s.Members) != 2 || s.MembersSlotsHeld == nil || *s.MembersSlotsHeld != 2 ||
			s.MembersQueued == nil || *s.MembersQueued != 4 || s.UnfairUntil != nil {
			t.Errorf("family view: %s", line)
		}
		for _, m := range s.Members {
			if m.Held != 1 || m.Queued != 2 || m.Limit == nil || *m.Limit != 3 {
				t.Errorf("member %+v, want 1 held, 2 queued, limit 3", m)
			}
		}
	}

	// --top bounds the members listed, as status's does.
	code, out, _ = runCmd(t, "watch", fam, "--count", "1", "--json", "--top", "1")
	var js snapshot
	if code != exitOK || json.Unmarshal([]byte(out), &js) != nil || len(js.Members) != 1 || js.MemberCount != 2 {
		t.Fatalf("watch --top 1: exit %d: %s", code, out)
	}
}

// TestStatusUnfairNotCalledFair: status never calls an unfair family fair.
// Redis does not store a family's variant (both use the same keys; each
// call tells the scripts its own), so the command says what it counts
// (fair queue entries) and reports the sign that unfair waiters leave
// (they ask for freed-slot notices); it used to print "N queued (fair)"
// for every family and, for a full unfair semaphore, "0 waiting in the
// fair queue". (Issue 43, 6.)
func TestStatusUnfairNotCalledFair(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	client := redistest.Client(t)
	fam := redistest.Name(t)
	f, err := unfair.NewFamily(client, fam, 2, unfair.FamilyOptions{Total: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := f.Get("a")
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.TryAcquireN(ctx, 2) // member a and the total full
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	stop := waiters(ctx, a)
	defer stop()
	meta := core.KeysForMember("redsem", fam, "a").List[core.KeyMeta]
	waitFor(t, 10*time.Second, "the unfair waiter to ask for freed-slot notices", func() bool {
		want, err1 := client.HGet(ctx, meta, "_want").Int64()
		now, err2 := client.Time(ctx).Result()
		return err1 == nil && err2 == nil && want > now.UnixMilli()
	})

	code, out, errs := runCmd(t, "status", fam)
	if code != exitOK || errs != "" {
		t.Fatalf("status %s: exit %d, stderr %q", fam, code, errs)
	}
	t.Logf("status %s:\n%s", fam, out)
	if strings.Contains(out, "(fair)") {
		t.Errorf("status calls an unfair family fair:\n%s", out)
	}
	for _, want := range []string{
		"family total: 2; 2 slots held in all members, 0 queued in fair queues",
		"unfair waiters are retrying",
		"full: the family's total of 2 is all held, unfair waiters retrying",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status %s lacks %q", fam, want)
		}
	}

	code, out, errs = runCmd(t, "status", fam, "--key", "a")
	if code != exitOK || errs != "" {
		t.Fatalf("status --key a: exit %d, stderr %q", code, errs)
	}
	t.Logf("status %s --key a:\n%s", fam, out)
	if strings.Contains(out, "in the fair queue") {
		t.Errorf("status of a full unfair member counts its waiters in a fair queue:\n%s", out)
	}
	for _, want := range []string{"full: all 2 slots held, unfair waiters retrying", "unfair waiters are retrying"} {
		if !strings.Contains(out, want) {
			t.Errorf("status --key a lacks %q", want)
		}
	}
	unfairUntil := func(args ...string) {
		t.Helper()
		code, out, _ := runCmd(t, args...)
		var js struct {
			ServerTime  time.Time  `json:"server_time"`
			UnfairUntil *time.Time `json:"unfair_waiters_until"`
		}
		if code != exitOK || json.Unmarshal([]byte(out), &js) != nil || js.UnfairUntil == nil || !js.UnfairUntil.After(js.ServerTime) {
			t.Errorf("%v: exit %d, no unfair_waiters_until after server_time: %s", args, code, out)
		}
	}
	unfairUntil("status", fam, "--json")
	unfairUntil("status", fam, "--key", "a", "--json")
	unfairUntil("watch", fam, "--json", "--count", "1")

	// A family without a total, of 4 shards, whose waiting member's key
	// is escaped in Redis: the sign is read from that member's keys.
	fam2 := redistest.Name(t) + "-shards"
	f2, err := unfair.NewFamily(client, fam2, 1, unfair.FamilyOptions{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	m, err := f2.Get("x{y}%")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := m.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(context.Background())
	stop2 := waiters(ctx, m)
	defer stop2()
	meta2 := core.MemberKeys("redsem", fam2, 4, "x{y}%").List[core.KeyMeta]
	waitFor(t, 10*time.Second, "the unfair waiter of x{y}% to ask for freed-slot notices", func() bool {
		want, err1 := client.HGet(ctx, meta2, "_want").Int64()
		now, err2 := client.Time(ctx).Result()
		return err1 == nil && err2 == nil && want > now.UnixMilli()
	})
	code, out, _ = runCmd(t, "status", fam2)
	if code != exitOK || !strings.Contains(out, "unfair waiters are retrying") || strings.Contains(out, "fair)") {
		t.Errorf("status %s: exit %d:\n%s", fam2, code, out)
	}
	unfairUntil("status", fam2, "--json")
}

// TestJSONKeysSnakeCase: every key of status's and watch's JSON is
// snake_case, the family's total too (it used to print Go's field names,
// "Total", "Held", "Waiting"). (Issue 43, 6.)
func TestJSONKeysSnakeCase(t *testing.T) {
	ctx := redistest.Ctx(t, 30*time.Second)
	client := redistest.Client(t)
	fam := redistest.Name(t)
	f, err := fair.NewFamily(client, fam, 2, fair.FamilyOptions{Total: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := f.Get("a")
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	stop := waiters(ctx, a)
	defer stop()
	waitFor(t, 10*time.Second, "a's waiter queued", func() bool {
		st, err := a.Status(ctx)
		return err == nil && len(st.Waiters) == 1
	})
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any, keys map[string]bool)
	walk = func(path string, v any, keys map[string]bool) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				keys[path+"."+k] = true
				walk(path+"."+k, e, keys)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e, keys)
			}
		}
	}
	for _, args := range [][]string{
		{"status", fam, "--json"},
		{"watch", fam, "--json", "--count", "1"},
		{"status", fam, "--key", "a", "--json", "--lease-ttl", "30s"},
		{"watch", fam, "--key", "a", "--json", "--count", "1"},
	} {
		code, out, errs := runCmd(t, args...)
		var v any
		if code != exitOK || json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("%v: exit %d, stderr %q: %s", args, code, errs, out)
		}
		keys := map[string]bool{}
		walk("", v, keys)
		var bad []string
		for k := range keys {
			if !snake.MatchString(k[strings.LastIndex(k, ".")+1:]) {
				bad = append(bad, k)
			}
		}
		sort.Strings(bad)
		if len(bad) > 0 {
			t.Errorf("%v: keys not in snake_case: %v\n%s", args, bad, out)
		}
		for _, want := range []string{".holders[].slot", ".waiters[].position"} {
			if args[2] == "--key" && !keys[want] {
				t.Errorf("%v: no key %s (the walk missed the lists?)", args, want)
			}
		}
		if args[2] != "--key" && !strings.Contains(out, `"total":{"total":3,"slots_held":2,"queued":1}`) {
			t.Errorf("%v: no family total {total 3, slots_held 2, queued 1}: %s", args, out)
		}
		if args[0] == "status" && args[2] != "--key" {
			// docs/operations.md's example of a family's JSON shows keys
			// that the command prints.
			doc, err := os.ReadFile("../../docs/operations.md")
			if err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile("(?s)```json\n(.*?)```").FindSubmatch(doc)
			var ex any
			if m == nil || json.Unmarshal(m[1], &ex) != nil {
				t.Fatalf("docs/operations.md: no JSON example of a family that parses")
			}
			docKeys := map[string]bool{}
			walk("", ex, docKeys)
			for k := range docKeys {
				if !keys[k] {
					t.Errorf("docs/operations.md's family JSON shows %s, which status --json does not print", k)
				}
			}
		}
	}
}
