package fair_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// TestMeasureFamily measures what many keys cost in one process, a Family
// against as many separate fair.New semaphores: connections to Redis,
// goroutines, Go heap, Redis memory and heartbeat scripts per second. It
// runs only with REDSEM_MEASURE=1 (REDSEM_MEASURE_KEYS keys, default 10000,
// each acquired and released once; REDSEM_MEASURE_WAITERS of them, default
// 1000, then held with one waiter queued). The numbers are in
// docs/operations.md ("Keyed families"):
//
//	REDSEM_MEASURE=1 go test -run TestMeasureFamily -v ./fair/
func TestMeasureFamily(t *testing.T) {
	if os.Getenv("REDSEM_MEASURE") != "1" {
		t.Skip("set REDSEM_MEASURE=1 to measure")
	}
	keys, waiters := envInt(t, "REDSEM_MEASURE_KEYS", 10000), envInt(t, "REDSEM_MEASURE_WAITERS", 1000)
	var rows []string
	for _, mode := range []string{"family", "family, 16 shards", "separate"} {
		for _, r := range measure(t, mode, keys, waiters) {
			rows = append(rows, r)
		}
	}
	fmt.Println("| setup | phase | connections (pub/sub) | goroutines | Go heap | Redis memory | scripts/s while idle-waiting |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

type sample struct {
	goroutines int
	heap       uint64
	redisMem   int64
}

func take(t *testing.T, ctx context.Context, admin *redis.Client) sample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return sample{runtime.NumGoroutine(), ms.HeapAlloc, infoInt(t, ctx, admin, "memory", "used_memory")}
}

func infoInt(t *testing.T, ctx context.Context, c *redis.Client, section, field string) int64 {
	t.Helper()
	v, err := c.Info(ctx, section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(v, "\n") {
		if k, rest, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			n, _ := strconv.ParseInt(rest, 10, 64)
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

func measure(t *testing.T, mode string, keys, waiters int) []string {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	client := redis.NewClient(srv.Options())
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	base := take(t, ctx, admin)
	row := func(phase string, rate string) string {
		s := take(t, ctx, admin)
		conns := infoInt(t, ctx, admin, "clients", "connected_clients") - 1 // not admin
		ps := pubsubClients(t, ctx, admin)
		return fmt.Sprintf("| %s | %s | %d (%d) | %d | %.1f MiB | %.1f MiB | %s |", mode, phase, conns, ps,
			s.goroutines-base.goroutines, float64(int64(s.heap)-int64(base.heap))/(1<<20),
			float64(s.redisMem-base.redisMem)/(1<<20), rate)
	}

	var fam *fair.Family
	var sems []*fair.Semaphore
	get := func(i int) *fair.Semaphore {
		key := fmt.Sprint("tenant-", i)
		if fam != nil {
			s, err := fam.Get(key)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		if i < len(sems) {
			return sems[i]
		}
		s, err := fair.New(client, "measure:"+key, 1, fair.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
		return s
	}
	if strings.HasPrefix(mode, "family") {
		shards := 1
		if mode == "family, 16 shards" {
			shards = 16
		}
		var err error
		if fam, err = fair.NewFamily(client, "measure", 1, fair.FamilyOptions{Shards: shards}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		if fam != nil {
			_ = fam.Close()
		}
		for _, s := range sems {
			_ = s.Close()
		}
	}()

	start := time.Now()
	for i := range keys {
		l, err := get(i).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: %d acquire/release in %v", mode, keys, time.Since(start))
	var out []string
	out = append(out, row(fmt.Sprintf("%d keys used once", keys), "-"))

	wctx, stop := context.WithCancel(ctx)
	var holders []redsem.Lease
	done := make(chan struct{}, waiters)
	for i := range waiters {
		s := get(i)
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, l)
		go func() {
			if l, err := s.Acquire(wctx); err == nil {
				_ = l.Release(ctx)
			}
			done <- struct{}{}
		}()
	}
	for i := range waiters {
		waitWaiters(t, ctx, get(i), 1)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	window := 3 * time.Second
	time.Sleep(window) // a measurement window, not synchronisation
	rate := float64(scriptCalls(commandStats(t, ctx, admin))) / window.Seconds()
	out = append(out, row(fmt.Sprintf("%d of them held, 1 waiter each", waiters), fmt.Sprintf("%.0f", rate)))
	stop()
	for range waiters {
		<-done
	}
	for _, l := range holders {
		_ = l.Release(ctx)
	}
	return out
}
