package core

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem/internal/human"
)

// The texts of the library's errors say what happened once, as a person
// writes it: one "redsem: " prefix, the semaphore named once (a family
// member by its family's name and its key: who), durations and rates
// without zero units (package human). A sentinel matched by an error whose
// text says it all is matched (sentinelErr) but not repeated; one that is
// the error's headline is said without its own prefix (bare).

// familyName is the name of e's family for a member of a family, whose
// name is its key; "" for a semaphore of its own, and for the family's own
// engines (root, famEng), whose name is the family's.
func (e *Engine) familyName() string {
	if e.fam == nil || e == e.fam.famEng {
		return ""
	}
	return e.fam.Name()
}

// who names e in an error: its quoted name, or for a member of a family
// the family's name with the member's key (human.Semaphore).
func (e *Engine) who() string { return human.Semaphore(e.familyName(), e.cfg.Name) }

// sentinelErr is an error whose text says it all that also matches a
// sentinel, without the sentinel's text after it (`... limit in force is
// 2`, not `... limit in force is 2: redsem: weight outside [1, limit]`).
type sentinelErr struct {
	err      error // the text, and what it wraps
	sentinel error
}

func (e *sentinelErr) Error() string   { return e.err.Error() }
func (e *sentinelErr) Unwrap() []error { return []error{e.err, e.sentinel} }

// errorf formats an error (as fmt.Errorf: %w wraps) that matches sentinel
// too, without its text.
func errorf(sentinel error, format string, args ...any) error {
	return &sentinelErr{err: fmt.Errorf(format, args...), sentinel: sentinel}
}

// bareErr is a sentinel said inside a text that has the prefix already:
// its text without "redsem: " (`redsem: "db": Redis unavailable: ...`);
// it matches the sentinel.
type bareErr struct{ sentinel error }

func (e bareErr) Error() string { return strings.TrimPrefix(e.sentinel.Error(), "redsem: ") }
func (e bareErr) Unwrap() error { return e.sentinel }

// bare is sentinel for a text that says "redsem: " already.
func bare(sentinel error) error { return bareErr{sentinel} }

// leadName returns the name at the start of s with the ": " after it, as
// who writes it (`"db": `, `family "t", key "k": `), or "".
func leadName(s string) string {
	family := strings.HasPrefix(s, "family ")
	rest := strings.TrimPrefix(s, "family ")
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return ""
	}
	rest = rest[len(q):]
	if after, ok := strings.CutPrefix(rest, ", key "); ok && family {
		k, err := strconv.QuotedPrefix(after)
		if err != nil {
			return ""
		}
		rest = after[len(k):]
	}
	if !strings.HasPrefix(rest, ": ") {
		return ""
	}
	return s[:len(s)-len(rest)+2]
}

// retold is err said in other words (msg): a script's refusal without
// its "ERR redsem: ", which wrap's prefix says already. It matches what err
// matches (a redis.Error).
type retold struct {
	msg string
	err error
}

func (e *retold) Error() string { return e.msg }
func (e *retold) Unwrap() error { return e.err }

// duration formats d for an error's text ("1m", not "1m0s").
func duration(d time.Duration) string { return human.Duration(d) }
