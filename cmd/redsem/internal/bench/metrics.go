package bench

import (
	"math"
	"sort"
	"time"

	"github.com/redsem/redsem"
)

// Record is one hold by one worker, in Unix nanoseconds of one clock (the
// machine's wall clock, shared by all processes of a run).
type Record struct {
	Worker int   `json:"w"` // worker index in [0, workers)
	Start  int64 `json:"s"` // Acquire called
	Got    int64 `json:"g"` // Acquire returned (the hold begins)
	Rel    int64 `json:"r"` // Release called (the hold ends)
	// Weight is how many slots the hold took; 0 means 1.
	Weight int `json:"n,omitempty"`
	// Token is the lease's fencing token (redsem: the server's clock in µs
	// at the grant, or just above); 0 for variants without one.
	Token int64 `json:"t,omitempty"`
}

// slots is how many slots the hold took.
func (r Record) slots() int64 { return int64(max(r.Weight, 1)) }

// Metrics are the numbers computed from a trace of records; see Analyze.
type Metrics struct {
	Holds       int     `json:"holds"`
	HoldsPerSec float64 `json:"holds_per_s"`
	// Utilisation is the slot-time of the measured holds inside the window
	// (sum of weight x hold) over limit x window: 1 means every slot was
	// busy all the time.
	Utilisation float64 `json:"utilisation"`
	MeanHoldMs  float64 `json:"mean_hold_ms"`
	// MeanWeight is the mean number of slots per hold (1 without weights).
	MeanWeight float64 `json:"mean_weight"`
	WaitP50Ms  float64 `json:"wait_p50_ms"`
	WaitP90Ms  float64 `json:"wait_p90_ms"`
	WaitP99Ms  float64 `json:"wait_p99_ms"`
	WaitMaxMs  float64 `json:"wait_max_ms"`
	// IdealWaitMs is the mean wait of a perfect FIFO semaphore with no
	// handoff cost: (workers x mean weight - limit) / limit x mean hold (0
	// when the workers never ask for more than the limit). With weights it
	// is an estimate: it ignores the slots a big acquire leaves idle.
	IdealWaitMs float64 `json:"ideal_wait_ms"`
	// WaitP99OverIdeal is WaitP99Ms / IdealWaitMs (0 when the ideal is 0).
	WaitP99OverIdeal float64 `json:"wait_p99_over_ideal"`
	// Handoffs counts acquires paired with a release (see Handoffs).
	Handoffs     int     `json:"handoffs"`
	HandoffP50Ms float64 `json:"handoff_p50_ms"`
	HandoffP99Ms float64 `json:"handoff_p99_ms"`
	// Jain is Jain's fairness index over holds per worker, in [1/workers, 1].
	Jain float64 `json:"jain"`
	// MaxHolders is the most slots that overlapping measured holds took at
	// once (with one slot per hold: the most holders); never above limit.
	MaxHolders int `json:"max_holders"`
}

// Analyze computes the metrics of a run of workers on a semaphore of limit
// slots, observed in the window [start, end) (Unix ns). Holds are clipped to
// the window for utilisation; every record counts for the other metrics.
func Analyze(recs []Record, limit, workers int, start, end int64) Metrics {
	m := Metrics{Holds: len(recs)}
	window := end - start
	if window <= 0 || limit <= 0 {
		return m
	}
	m.HoldsPerSec = float64(len(recs)) / (float64(window) / 1e9)
	m.Utilisation = Utilisation(recs, limit, start, end)
	waits := make([]float64, 0, len(recs))
	var holdSum, weightSum float64
	for _, r := range recs {
		waits = append(waits, ms(r.Got-r.Start))
		holdSum += ms(r.Rel - r.Got)
		weightSum += float64(r.slots())
	}
	if len(recs) > 0 {
		m.MeanHoldMs = holdSum / float64(len(recs))
		m.MeanWeight = weightSum / float64(len(recs))
	}
	sort.Float64s(waits)
	m.WaitP50Ms = Percentile(waits, 50)
	m.WaitP90Ms = Percentile(waits, 90)
	m.WaitP99Ms = Percentile(waits, 99)
	m.WaitMaxMs = Percentile(waits, 100)
	m.IdealWaitMs = IdealWait(float64(workers)*max(m.MeanWeight, 1), limit, m.MeanHoldMs)
	if m.IdealWaitMs > 0 {
		m.WaitP99OverIdeal = m.WaitP99Ms / m.IdealWaitMs
	}
	h := Handoffs(recs)
	sort.Float64s(h)
	m.Handoffs = len(h)
	m.HandoffP50Ms = Percentile(h, 50)
	m.HandoffP99Ms = Percentile(h, 99)
	m.Jain = Jain(PerWorker(recs, workers))
	m.MaxHolders = MaxOverlap(recs)
	return m
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// PerWorker counts the holds of each worker in [0, workers), those with
// none as 0 (records of other workers are left out).
func PerWorker(recs []Record, workers int) []float64 {
	per := make([]float64, workers)
	for _, r := range recs {
		if r.Worker >= 0 && r.Worker < workers {
			per[r.Worker]++
		}
	}
	return per
}

// Utilisation is the slot-time of the holds [Got, Rel) clipped to
// [start, end) (each hold's length times its weight), over
// limit x (end - start).
func Utilisation(recs []Record, limit int, start, end int64) float64 {
	if end <= start || limit <= 0 {
		return 0
	}
	var busy float64
	for _, r := range recs {
		a, b := max(r.Got, start), min(r.Rel, end)
		if b > a {
			busy += float64(b-a) * float64(r.slots())
		}
	}
	return busy / (float64(limit) * float64(end-start))
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted values by
// the nearest-rank method: the smallest value with at least p% of the values
// at or below it. It returns 0 for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// IdealWait is the mean wait in a perfect FIFO semaphore where workers
// that together ask for demand slots (the number of workers, times the mean
// weight with --weights) loop acquire-hold-release with mean hold meanHold
// and no handoff cost: each waits for (demand - limit) / limit holds.
func IdealWait(demand float64, limit int, meanHold float64) float64 {
	if demand <= float64(limit) || limit <= 0 {
		return 0
	}
	return (demand - float64(limit)) / float64(limit) * meanHold
}

// Handoffs returns, in ms, the handoff latency of every acquire that was
// waiting when a slot was released: each Acquire return is paired with the
// most recent Release call before it (on the same semaphore), and counts
// only if that Acquire had started before the Release (it was waiting).
func Handoffs(recs []Record) []float64 {
	rels := make([]int64, 0, len(recs))
	for _, r := range recs {
		rels = append(rels, r.Rel)
	}
	sort.Slice(rels, func(i, j int) bool { return rels[i] < rels[j] })
	out := make([]float64, 0, len(recs))
	for _, r := range recs {
		// index of the first release at or after Got; the one before it is
		// the most recent release strictly before Got.
		i := sort.Search(len(rels), func(i int) bool { return rels[i] >= r.Got })
		if i == 0 {
			continue
		}
		rel := rels[i-1]
		if r.Start < rel {
			out = append(out, ms(r.Got-rel))
		}
	}
	return out
}

// Jain returns Jain's fairness index (sum x)^2 / (n sum x^2): 1 when every
// value is equal, 1/n when one takes all. It returns 0 for no values or all
// zeros.
func Jain(x []float64) float64 {
	var s, s2 float64
	for _, v := range x {
		s += v
		s2 += v * v
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(x)) * s2)
}

// MaxOverlap returns the most slots that holds [Got, Rel) overlapping at one
// instant took together (each hold counts its weight). A hold that ends
// exactly when another begins does not overlap it.
func MaxOverlap(recs []Record) int {
	type ev struct {
		t int64
		d int64
	}
	evs := make([]ev, 0, 2*len(recs))
	for _, r := range recs {
		evs = append(evs, ev{r.Got, r.slots()}, ev{r.Rel, -r.slots()})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].d < evs[j].d // ends before starts at the same instant
	})
	var cur, best int64
	for _, e := range evs {
		cur += e.d
		best = max(best, cur)
	}
	return int(best)
}

// Median returns the median of ds (the lower middle for an even count), or
// 0 for none. It sorts ds.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[(len(ds)-1)/2]
}

// RateReport is what a run under a rate (--rate) achieved. Windows are
// counted on the grants' fencing tokens (redsem's are the Redis server's
// clock in µs at the grant, or just above: the times the rate is enforced
// on), or, for a trace without tokens, on the times the workers' Acquire
// calls returned (a little later than the grants, so a window of those may
// hold a grant more or fewer).
type RateReport struct {
	Rate  string  `json:"rate"`  // as ParseRate reads it
	Limit int     `json:"limit"` // Rate.Limit
	PerS  float64 `json:"per_s"` // Rate.Per in seconds
	// On says which times the windows were counted on: "token" or "client".
	On string `json:"on"`
	// Granted is the slots granted in the run; Allowed the most the rate
	// allows in it (Limit per started window: Limit x ceil(duration/Per));
	// Achieved is Granted/Allowed.
	Granted  int64   `json:"granted"`
	Allowed  int64   `json:"allowed"`
	Achieved float64 `json:"achieved"`
	// BusiestWindow is the most slots granted in any window of length Per;
	// MeanPerWindow the slots granted per Per on average.
	BusiestWindow int64   `json:"busiest_window"`
	MeanPerWindow float64 `json:"mean_per_window"`
}

// RateOf reports the grants of records made from start to end (Unix ns)
// against rate.
func RateOf(recs []Record, rate redsem.Rate, start, end int64) *RateReport {
	per := int64(rate.Per)
	r := &RateReport{Rate: rate.String(), Limit: rate.Limit, PerS: rate.Per.Seconds(), On: "token"}
	if per <= 0 || end <= start {
		return r
	}
	type grant struct{ at, n int64 }
	gs := make([]grant, 0, len(recs))
	for _, rec := range recs {
		if rec.Token == 0 {
			r.On = "client"
		}
	}
	for _, rec := range recs {
		at := rec.Got
		if r.On == "token" {
			at = rec.Token * 1000
		}
		gs = append(gs, grant{at, rec.slots()})
		r.Granted += rec.slots()
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].at < gs[j].at })
	var in int64
	for i, j := 0, 0; j < len(gs); j++ {
		in += gs[j].n
		for gs[i].at <= gs[j].at-per {
			in -= gs[i].n
			i++
		}
		r.BusiestWindow = max(r.BusiestWindow, in)
	}
	windows := (end - start + per - 1) / per
	r.Allowed = int64(rate.Limit) * windows
	if r.Allowed > 0 {
		r.Achieved = float64(r.Granted) / float64(r.Allowed)
	}
	r.MeanPerWindow = float64(r.Granted) * float64(per) / float64(end-start)
	return r
}
