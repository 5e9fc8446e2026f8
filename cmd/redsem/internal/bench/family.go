package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
)

// The family workload (--family TOTAL): a keyed family whose members each
// admit --limit holders and, all together, TOTAL (FamilyOptions.Total). A
// hot tenant has all the workers but two, a cold tenant those two; each
// worker acquires, holds (--hold) and releases, for --duration. It reports
// how much of the total was used (slot-time held over TOTAL x duration),
// each tenant's holds and mean wait, and the cost of a hold: acquire plus
// release, one worker and nothing contended, against a member of the same
// family without a total (the same run, the same server).

// FamilyResult is one family run.
type FamilyResult struct {
	Variant     string
	Total       int // 0: the members of a family without a total
	Limit       int
	Duration    time.Duration
	Utilisation float64 // slot-time held / (Total x Duration); Total 0: over Limit+2
	PeakHeld    int     // the most slots held at once, as the workers counted
	Hot, Cold   tenantResult
	HoldCost    time.Duration // acquire + release, uncontended (mean)
}

type tenantResult struct {
	Workers  int
	Holds    int
	MeanWait time.Duration
}

// familyOf makes the family of variant, with total (0: none).
func familyOf(variant string, client redis.UniversalClient, name string, limit, total int, prefix string) (func(key string) (redsem.Semaphore, error), func() error, error) {
	if variant == "fair" {
		f, err := fair.NewFamily(client, name, limit, fair.FamilyOptions{Total: total, Options: fair.Options{KeyPrefix: prefix}})
		if err != nil {
			return nil, nil, err
		}
		return func(k string) (redsem.Semaphore, error) { return f.Get(k) }, f.Close, nil
	}
	f, err := unfair.NewFamily(client, name, limit, unfair.FamilyOptions{Total: total, Options: unfair.Options{KeyPrefix: prefix}})
	if err != nil {
		return nil, nil, err
	}
	return func(k string) (redsem.Semaphore, error) { return f.Get(k) }, f.Close, nil
}

// RunFamily runs the family workload once.
func RunFamily(ctx context.Context, client redis.UniversalClient, variant string, limit, total, workers int, hold Hold, d time.Duration, prefix string, seed uint64) (FamilyResult, error) {
	name := "bench-family-" + uuid.NewString()[:8]
	get, closeFam, err := familyOf(variant, client, name, limit, total, prefix)
	if err != nil {
		return FamilyResult{}, err
	}
	defer closeFam()
	r := FamilyResult{Variant: variant, Total: total, Limit: limit, Duration: d}
	cost, err := holdCost(ctx, get, "probe", 200)
	if err != nil {
		return r, err
	}
	r.HoldCost = cost
	cold := min(2, workers-1)
	r.Hot.Workers, r.Cold.Workers = workers-cold, cold
	var mu sync.Mutex
	var held, peak int
	var slotTime time.Duration
	var waits [2]time.Duration
	var holds [2]int
	end := time.Now().Add(d)
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var wg sync.WaitGroup
	var firstErr error
	for w := range workers {
		tenant := 0 // hot
		if w >= r.Hot.Workers {
			tenant = 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			sem, err := get([]string{"hot", "cold"}[tenant])
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return
			}
			for wctx.Err() == nil {
				start := time.Now()
				l, err := sem.Acquire(wctx)
				if err != nil {
					if wctx.Err() == nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					return
				}
				got := time.Now()
				mu.Lock()
				held++
				peak = max(peak, held)
				waits[tenant] += got.Sub(start)
				holds[tenant]++
				mu.Unlock()
				time.Sleep(hold.Sample(rng))
				mu.Lock()
				held--
				slotTime += time.Since(got)
				mu.Unlock()
				_ = l.Release(context.WithoutCancel(wctx))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return r, firstErr
	}
	bound := total
	if bound == 0 {
		bound = limit + cold // what the two tenants can hold at most
	}
	r.Utilisation = float64(slotTime) / (float64(bound) * float64(d))
	r.PeakHeld = peak
	for i, t := range []*tenantResult{&r.Hot, &r.Cold} {
		t.Holds = holds[i]
		if holds[i] > 0 {
			t.MeanWait = waits[i] / time.Duration(holds[i])
		}
	}
	return r, nil
}

// holdCost is the median of n acquire+release pairs of one member, one
// at a time.
func holdCost(ctx context.Context, get func(string) (redsem.Semaphore, error), key string, n int) (time.Duration, error) {
	sem, err := get(key)
	if err != nil {
		return 0, err
	}
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		l, err := sem.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		if err := l.Release(ctx); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], nil
}

// printFamily writes the family runs as a table.
func printFamily(w io.Writer, rs []FamilyResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\ttotal\tlimit\tused of total\tpeak held\thot holds\thot wait\tcold holds\tcold wait\thold cost (acquire+release)")
	for _, r := range rs {
		total := fmt.Sprint(r.Total)
		if r.Total == 0 {
			total = fmt.Sprintf("none (%d+%d)", r.Limit, r.Cold.Workers)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%%\t%d\t%d\t%v\t%d\t%v\t%v\n", r.Variant, total, r.Limit, 100*r.Utilisation, r.PeakHeld,
			r.Hot.Holds, r.Hot.MeanWait.Round(time.Microsecond), r.Cold.Holds, r.Cold.MeanWait.Round(time.Microsecond),
			r.HoldCost.Round(time.Microsecond))
	}
	_ = tw.Flush()
}

// familyRuns runs the family workload for each variant: with the total
// and, for the cost of a hold against a plain member, without one.
func (b *bencher) familyRuns() error {
	hold, err := ParseHold(b.f.hold)
	if err != nil {
		return err
	}
	var rs []FamilyResult
	for _, v := range strings.Split(b.f.variants, ",") {
		for _, total := range []int{b.f.family, 0} {
			ctx, cancel := context.WithTimeout(context.Background(), b.f.duration+time.Minute)
			r, err := RunFamily(ctx, b.client, v, b.f.limit, total, b.f.workers, hold, b.f.duration, b.f.prefix, b.f.seed)
			cancel()
			if err != nil {
				return fmt.Errorf("family %s, total %d: %w", v, total, err)
			}
			rs = append(rs, r)
			if b.f.jsonOut {
				if err := jsonLine(b.stdout, r); err != nil {
					return err
				}
			}
		}
	}
	if !b.f.jsonOut {
		printFamily(b.stdout, rs)
	}
	return nil
}
