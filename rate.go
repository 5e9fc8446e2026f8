package redsem

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redsem/redsem/internal/human"
)

// Rate bounds how many slots may be granted in any window of length Per, by the
// Redis server's clock (a sliding window over grant times; a weighted grant
// counts its weight). The zero Rate means no rate bound.
//
// A grant happens only when a slot is free and fewer than Limit slots were
// granted in the last Per: no window of length Per ever holds more than
// Limit granted slots. A request re-sent after a lost reply and a renewal
// count nothing; a lease that is released frees its slot at once but its
// grant keeps counting until Per has passed.
type Rate struct {
	Limit int           // slots granted per Per at most; 0 with Per 0: no bound
	Per   time.Duration // the window's length, whole milliseconds (rounded up)
}

// IsZero reports whether r is the zero Rate (no rate bound).
func (r Rate) IsZero() bool { return r.Limit == 0 && r.Per == 0 }

// String formats r as ParseRate reads it and as a person writes it,
// "60/1m", "5/2s", "10/1h30m" (Per without the zero units after its
// largest), or "none" for the zero Rate.
func (r Rate) String() string {
	if r.IsZero() {
		return "none"
	}
	return strconv.Itoa(r.Limit) + "/" + human.Duration(r.Per)
}

// ParseRate reads a rate written "LIMIT/PER", where PER is a Go duration
// ("60/1m", "100/1s", "5/250ms") or a bare unit standing for one of it
// ("60/m", "10/s", "1000/h"); "none", "0" and "" are the zero Rate. It
// does not validate the bounds (New and SetRate do): "5/-1s" is a Rate with
// a negative Per, which they refuse. Its errors quote s.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "", "0", "none":
		return Rate{}, nil
	}
	l, p, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("redsem: rate %q: want LIMIT/PER, e.g. 60/1m", s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(l))
	if err != nil {
		return Rate{}, fmt.Errorf("redsem: rate %q: limit %q is not an integer", s, l)
	}
	p = strings.TrimSpace(p)
	if r, _ := utf8.DecodeRuneInString(p); unicode.IsLetter(r) {
		// A bare unit: "m" is one minute. time's error would quote "1"+p,
		// which the caller never wrote.
		d, err := time.ParseDuration("1" + p)
		if err != nil {
			return Rate{}, fmt.Errorf("redsem: rate %q: period %q is not a unit (ns, us, µs, ms, s, m, h) or a duration (1m, 250ms)", s, p)
		}
		return Rate{Limit: n, Per: d}, nil
	}
	d, err := time.ParseDuration(p)
	if err != nil {
		return Rate{}, fmt.Errorf("redsem: rate %q: period: %w", s, err)
	}
	return Rate{Limit: n, Per: d}, nil
}
