package bench

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// Workload is one process's share of a run.
type Workload struct {
	Sem        Sem
	Workers    int       // workers in this process
	WorkerBase int       // index of this process's first worker in the run
	Hold       Hold      // how long each hold lasts
	Weights    Weights   // slots per acquire; zero: 1
	Start, End time.Time // workers begin at Start; no Acquire is started or waits past End
	Seed       uint64    // seeds the hold distribution
	GoSleep    bool      // holds sleep with time.Sleep, not a timerfd (holder.go)
	// Progress, if not nil, is incremented once per completed hold.
	Progress *atomic.Int64
}

// Trace is what a process reports after its workers stopped.
type Trace struct {
	Records []Record `json:"records"`
	// Commands is how many commands this process's Redis client sent
	// (counted by a CountCommands hook; script calls count once each).
	Commands int64 `json:"commands"`
	// Errors counts failed Acquire and Release calls (not the end of the run).
	Errors   int    `json:"errors"`
	LastErr  string `json:"last_error,omitempty"`
	Workers  int    `json:"workers"`
	ProcHint string `json:"proc,omitempty"`
}

// RunWorkers runs w.Workers goroutines that loop acquire, hold, release from
// w.Start until w.End and returns their records. A hold that began before End
// completes; an Acquire still waiting at End is abandoned (not recorded).
func RunWorkers(w Workload) Trace {
	var (
		mu      sync.Mutex
		tr      = Trace{Workers: w.Workers}
		wg      sync.WaitGroup
		lastErr error
	)
	ctx, cancel := context.WithDeadline(context.Background(), w.End)
	defer cancel()
	for i := 0; i < w.Workers; i++ {
		wg.Add(1)
		go func(idx int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(w.Seed, uint64(idx)))
			h := newHolder(w.GoSleep)
			defer h.close()
			var recs []Record
			var errs int
			var last error
			if d := time.Until(w.Start); d > 0 {
				time.Sleep(d)
			}
			for ctx.Err() == nil {
				n := w.Weights.Sample(rng)
				s := time.Now()
				var release func(context.Context) error
				var token int64
				var err error
				if ta, ok := w.Sem.(tokenAcquirer); ok {
					release, token, err = ta.AcquireToken(ctx, n)
				} else {
					release, err = w.Sem.Acquire(ctx, n)
				}
				if err != nil {
					if ctx.Err() != nil && IsDone(err) {
						break
					}
					errs++
					last = err
					time.Sleep(time.Millisecond) // do not spin on a broken server
					continue
				}
				g := time.Now()
				h.hold(w.Hold.Sample(rng))
				r := time.Now()
				if err := release(context.Background()); err != nil {
					errs++
					last = err
				}
				rec := Record{Worker: idx, Start: s.UnixNano(), Got: g.UnixNano(), Rel: r.UnixNano(), Token: token}
				if n > 1 {
					rec.Weight = n
				}
				recs = append(recs, rec)
				if w.Progress != nil {
					w.Progress.Add(1)
				}
			}
			mu.Lock()
			tr.Records = append(tr.Records, recs...)
			tr.Errors += errs
			if last != nil {
				lastErr = last
			}
			mu.Unlock()
		}(w.WorkerBase + i)
	}
	wg.Wait()
	if lastErr != nil {
		tr.LastErr = lastErr.Error()
	}
	return tr
}

// PingRTT returns the median of n sequential PING round trips (after a few
// to warm up the connection).
func PingRTT(ctx context.Context, c redis.UniversalClient, n int) (time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for i := -5; i < n; i++ {
		t := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		if i >= 0 {
			ds = append(ds, time.Since(t))
		}
	}
	return Median(ds), nil
}

// Uncontended runs n sequential TryAcquire+Release cycles on s (nobody
// else using it) and returns the median cycle, the mean cycle and the
// cycles per second over the whole loop.
func Uncontended(ctx context.Context, s redsem.Semaphore, n int) (median, mean time.Duration, perSec float64, err error) {
	ds := make([]time.Duration, 0, n)
	var start time.Time
	for i := -5; i < n; i++ {
		if i == 0 {
			start = time.Now()
		}
		t := time.Now()
		l, err := s.TryAcquire(ctx)
		if err != nil {
			return 0, 0, 0, err
		}
		if err := l.Release(ctx); err != nil {
			return 0, 0, 0, err
		}
		if i >= 0 {
			ds = append(ds, time.Since(t))
		}
	}
	el := time.Since(start)
	return Median(ds), el / time.Duration(n), float64(n) / el.Seconds(), nil
}
