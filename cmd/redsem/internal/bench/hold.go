package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Hold is how long a worker holds its slot: fixed, exponential or uniform.
type Hold struct {
	Kind     string        // "fixed", "exp" or "uniform"
	Mean     time.Duration // fixed: the hold; exp: the mean
	Min, Max time.Duration // uniform bounds
}

// ParseHold parses "2ms" (fixed), "exp:2ms" (exponential with mean 2ms) or
// "uniform:1ms-3ms". Durations are in Go syntax and must be positive
// (uniform: 0 < min <= max).
func ParseHold(s string) (Hold, error) {
	bad := func(why string) (Hold, error) {
		return Hold{}, fmt.Errorf("bench: bad hold %q: %s (want e.g. 2ms, exp:2ms or uniform:1ms-3ms)", s, why)
	}
	kind, arg, found := strings.Cut(s, ":")
	if !found {
		kind, arg = "fixed", s
	}
	switch kind {
	case "fixed", "exp":
		d, err := time.ParseDuration(arg)
		if err != nil {
			return bad(err.Error())
		}
		if d <= 0 {
			return bad("not positive")
		}
		return Hold{Kind: kind, Mean: d}, nil
	case "uniform":
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return bad("uniform needs min-max")
		}
		a, err := time.ParseDuration(lo)
		if err != nil {
			return bad(err.Error())
		}
		b, err := time.ParseDuration(hi)
		if err != nil {
			return bad(err.Error())
		}
		if a <= 0 || b < a {
			return bad("need 0 < min <= max")
		}
		return Hold{Kind: kind, Mean: (a + b) / 2, Min: a, Max: b}, nil
	}
	return bad("unknown kind " + kind)
}

// String is the form ParseHold reads.
func (h Hold) String() string {
	switch h.Kind {
	case "exp":
		return "exp:" + h.Mean.String()
	case "uniform":
		return "uniform:" + h.Min.String() + "-" + h.Max.String()
	}
	return h.Mean.String()
}

// Sample draws one hold.
func (h Hold) Sample(r *rand.Rand) time.Duration {
	switch h.Kind {
	case "exp":
		return time.Duration(r.ExpFloat64() * float64(h.Mean))
	case "uniform":
		return h.Min + time.Duration(r.Int64N(int64(h.Max-h.Min)+1))
	}
	return h.Mean
}
