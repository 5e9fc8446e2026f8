package lua_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// TestMeasureMemory prints the memory Redis uses per live holder and per
// queued waiter (issue 21, item 4): 2000 of each (REDSEM_MEASURE_N) with a
// 12-byte owner, on a server of its own, as the change in INFO used_memory.
// The figure moves with where n falls between the hash tables' doublings:
// compare runs of several n.
//
//	REDSEM_MEASURE=1 go test ./lua -run TestMeasureMemory -v
func TestMeasureMemory(t *testing.T) {
	if os.Getenv("REDSEM_MEASURE") == "" {
		t.Skip("a measurement: REDSEM_MEASURE=1 runs it")
	}
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	used := func() int64 {
		for _, l := range strings.Split(c.Info(ctx, "memory").Val(), "\r\n") {
			if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("REDSEM_MEASURE_N")); err == nil && v > 0 {
		n = v
	}
	measure := func(name string, limit, lease int, setup func(run func(...any))) float64 {
		k := core.KeysFor("redsem", name)
		run := func(args ...any) {
			s := lua.Acquire
			if args[0] == "beat" {
				s, args = lua.Heartbeat, args[1:]
			}
			if err := core.Script(s).Run(ctx, c, k.List, append([]any{k.Chan, "PUBLISH", limit}, args...)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		run("beat", "sess", 600000, "new")
		setup(run)
		before := used()
		for i := 0; i < n; i++ {
			run(uuid.NewString(), 1, lease, "queue", "sess", 1000, "host-1:12345", 0)
		}
		return float64(used()-before) / float64(n)
	}
	holder := measure("holders", n+10, 600000, func(func(...any)) {})
	waiter := measure("waiters", 1, 600000, func(run func(...any)) {
		run("holder", 1, 600000, "queue", "sess", 1000, "host-1:12345", 0)
	})
	t.Logf("per live holder %.0f B, per queued waiter %.0f B (used_memory, %d of each)", holder, waiter, n)
}
