package bench_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cmd/redsem/internal/bench"
)

const msNs = int64(time.Millisecond)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9 {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// A synthetic trace: limit 2, 4 workers, window [0, 10ms).
//
//	w0: start 0, got 0, rel 4      (wait 0)
//	w1: start 0, got 0, rel 5      (wait 0)
//	w2: start 0, got 4, rel 8      (wait 4; no release strictly before 4: no handoff)
//	w3: start 1, got 6, rel 12     (wait 5; most recent release before 6 is 5: handoff 1)
//	w0: start 4, got 8, rel 9      (wait 4; most recent release before 8 is 5: handoff 3)
func trace() []bench.Record {
	r := func(w int, s, g, rel int64) bench.Record {
		return bench.Record{Worker: w, Start: s * msNs, Got: g * msNs, Rel: rel * msNs}
	}
	return []bench.Record{
		r(0, 0, 0, 4), r(1, 0, 0, 5), r(2, 0, 4, 8), r(3, 1, 6, 12), r(0, 4, 8, 9),
	}
}

func TestUtilisationClipsToWindow(t *testing.T) {
	// busy inside [0,10): 4 + 5 + 4 + 4 (6..10, clipped) + 1 = 18 ms of 2 x 10.
	near(t, "utilisation", bench.Utilisation(trace(), 2, 0, 10*msNs), 18.0/20)
	near(t, "empty window", bench.Utilisation(trace(), 2, 5, 5), 0)
}

func TestAnalyzeSyntheticTrace(t *testing.T) {
	m := bench.Analyze(trace(), 2, 4, 0, 10*msNs)
	if m.Holds != 5 {
		t.Fatalf("holds = %d, want 5", m.Holds)
	}
	near(t, "holds/s", m.HoldsPerSec, 500)
	near(t, "mean hold", m.MeanHoldMs, (4+5+4+6+1)/5.0)
	// waits sorted: 0 0 4 4 5
	near(t, "p50", m.WaitP50Ms, 4)
	near(t, "p90", m.WaitP90Ms, 5)
	near(t, "max", m.WaitMaxMs, 5)
	near(t, "ideal", m.IdealWaitMs, (4.0-2)/2*4)
	near(t, "p99/ideal", m.WaitP99OverIdeal, 5.0/4)
	if m.Handoffs != 2 {
		t.Errorf("handoffs = %d, want 2", m.Handoffs)
	}
	near(t, "handoff p50", m.HandoffP50Ms, 1)
	near(t, "handoff p99", m.HandoffP99Ms, 3)
	// holds per worker 2,1,1,1: (5)^2 / (4 x 7)
	near(t, "jain", m.Jain, 25.0/28)
	if m.MaxHolders != 2 {
		t.Errorf("max holders = %d, want 2", m.MaxHolders)
	}
}

func TestHandoffs(t *testing.T) {
	r := func(s, g, rel int64) bench.Record { return bench.Record{Start: s, Got: g, Rel: rel} }
	got := bench.Handoffs([]bench.Record{
		r(0, 0, 10),   // first holder: no release before it
		r(1, 12, 20),  // waiting since 1, release at 10: handoff 2ns
		r(15, 16, 30), // started after the release at 10: not a handoff
		r(5, 25, 40),  // most recent release before 25 is 20: handoff 5ns
	})
	want := []float64{2e-6, 5e-6}
	if len(got) != len(want) {
		t.Fatalf("handoffs = %v, want %v", got, want)
	}
	for i := range want {
		near(t, "handoff", got[i], want[i])
	}
}

func TestPercentileNearestRank(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}, {0, 1}} {
		near(t, "percentile", bench.Percentile(v, c.p), c.want)
	}
	near(t, "none", bench.Percentile(nil, 50), 0)
}

func TestJain(t *testing.T) {
	near(t, "equal", bench.Jain([]float64{3, 3, 3}), 1)
	near(t, "one takes all", bench.Jain([]float64{9, 0, 0}), 1.0/3)
	near(t, "zeros", bench.Jain([]float64{0, 0}), 0)
}

func TestMaxOverlap(t *testing.T) {
	r := func(g, rel int64) bench.Record { return bench.Record{Got: g, Rel: rel} }
	if n := bench.MaxOverlap([]bench.Record{r(0, 5), r(5, 10), r(10, 15)}); n != 1 {
		t.Errorf("touching holds: max overlap %d, want 1", n)
	}
	if n := bench.MaxOverlap([]bench.Record{r(0, 10), r(2, 4), r(3, 12), r(11, 13)}); n != 3 {
		t.Errorf("max overlap %d, want 3", n)
	}
}

func TestIdealWait(t *testing.T) {
	near(t, "50 workers limit 5 hold 2ms", bench.IdealWait(50, 5, 2), 18)
	near(t, "no contention", bench.IdealWait(5, 5, 2), 0)
}

func TestParseHold(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range []string{"2ms", "exp:2ms", "uniform:1ms-3ms"} {
		h, err := bench.ParseHold(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if h.String() != s {
			t.Errorf("String() = %q, want %q", h.String(), s)
		}
		for i := 0; i < 1000; i++ {
			d := h.Sample(rng)
			if d < 0 || (h.Kind == "uniform" && (d < h.Min || d > h.Max)) || (h.Kind == "fixed" && d != h.Mean) {
				t.Fatalf("%s: sample %v out of range", s, d)
			}
		}
	}
	for _, s := range []string{"", "0ms", "-1ms", "exp:", "uniform:3ms-1ms", "uniform:1ms", "gauss:2ms", "2 parsecs"} {
		if _, err := bench.ParseHold(s); err == nil {
			t.Errorf("ParseHold(%q) accepted", s)
		}
	}
}

func TestChartSVG(t *testing.T) {
	x, y := bench.CDF([]float64{1, 2, 3, 4, 100}, 10)
	if len(x) != len(y) || y[len(y)-1] != 1 || x[len(x)-1] != 100 {
		t.Fatalf("CDF = %v %v", x, y)
	}
	svg := bench.Chart{Title: "a <b>", XLabel: "x", YLabel: "y", LogX: true,
		Series: []bench.Series{{Name: "fair", X: x, Y: y}}}.SVG()
	for _, want := range []string{"<svg", "</svg>", "a &lt;b&gt;", "<polyline", ">fair<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

// With weights, utilisation is slot-time and MaxOverlap counts slots:
// limit 4, window [0, 10ms): a 2-slot hold over [0, 5) and a 3-slot hold
// over [5, 10) overlapping a 1-slot hold over [4, 6).
func TestWeightedSlotTime(t *testing.T) {
	r := func(g, rel int64, n int) bench.Record {
		return bench.Record{Got: g * msNs, Rel: rel * msNs, Weight: n}
	}
	recs := []bench.Record{r(0, 5, 2), r(5, 10, 3), r(4, 6, 0)}
	// slot-time: 2x5 + 3x5 + 1x2 = 27 of 4 x 10
	near(t, "utilisation", bench.Utilisation(recs, 4, 0, 10*msNs), 27.0/40)
	if got := bench.MaxOverlap(recs); got != 4 {
		t.Errorf("max overlap = %d slots, want 4 (3 + 1 at t=5)", got)
	}
	m := bench.Analyze(recs, 4, 3, 0, 10*msNs)
	near(t, "mean weight", m.MeanWeight, 2)
}

func TestParseWeights(t *testing.T) {
	for in, want := range map[string]bench.Weights{"1-3": {1, 3}, "2": {2, 2}, " 1 - 1 ": {1, 1}} {
		got, err := bench.ParseWeights(in)
		if err != nil || got != want {
			t.Errorf("ParseWeights(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0-2", "3-1", "a-b", "-1"} {
		if _, err := bench.ParseWeights(in); err == nil {
			t.Errorf("ParseWeights(%q) accepted", in)
		}
	}
}

// RateOf counts windows on tokens (µs) when every record has one, else on
// the client's grant times; a weighted grant counts its weight.
func TestRateOf(t *testing.T) {
	ms := int64(time.Millisecond)
	recs := []bench.Record{
		{Got: 10 * ms, Token: 1_000}, {Got: 20 * ms, Token: 2_000, Weight: 2},
		{Got: 1015 * ms, Token: 1_001_000}, {Got: 1040 * ms, Token: 1_001_500},
	}
	rate := redsem.Rate{Limit: 3, Per: time.Second}
	// Tokens: the second ending at 1001.5 ms holds the grants of 2 ms (2
	// slots), 1001 ms and 1001.5 ms.
	r := bench.RateOf(recs, rate, 0, 2500*ms)
	if r.On != "token" || r.Granted != 5 || r.Allowed != 9 || r.BusiestWindow != 4 {
		t.Fatalf("on tokens: %+v", r)
	}
	// Client times (one record without a token): no second holds more
	// than 3 (20 ms and 1015 ms, or 10 ms and 20 ms).
	recs[0].Token = 0
	if r = bench.RateOf(recs, rate, 0, 2500*ms); r.On != "client" || r.BusiestWindow != 3 {
		t.Fatalf("on client times: %+v", r)
	}
}
