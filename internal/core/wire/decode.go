package wire

import (
	"strconv"
	"strings"
	"time"
)

// Decoding what Redis sends: script replies, field by field (reader), the
// grant lists in them (Grants), and the messages of the channels
// (ParseMessage for a fair session's, ParseFree for the unfair freed-slot
// notices). None of it panics on any input (decode_fuzz_test.go).

// reader decodes a script reply (a flat array) field by field. It never
// panics: the first field that is missing or of the wrong type records an
// error (a *ReplyError), and every later read returns a zero value.
type reader struct {
	script string
	v      []any
	i      int
	err    error
}

func (r *reader) fail(reason string) {
	if r.err == nil {
		r.err = &ReplyError{Script: r.script, Reply: r.v, Reason: reason}
	}
}

// next returns the next field, or nil after recording an error.
func (r *reader) next() any {
	if r.err != nil {
		return nil
	}
	if r.i >= len(r.v) {
		r.fail("too short")
		return nil
	}
	x := r.v[r.i]
	r.i++
	return x
}

func (r *reader) more() bool { return r.err == nil && r.i < len(r.v) }

// int reads an integer (Redis turns Lua numbers into integers).
func (r *reader) int() int64 {
	switch x := r.next().(type) {
	case int64:
		return x
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err == nil {
			return n
		}
	}
	r.fail("field " + strconv.Itoa(r.i) + " is not an integer")
	return 0
}

// str reads a string (an integer is taken in its decimal form).
func (r *reader) str() string {
	switch x := r.next().(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	r.fail("field " + strconv.Itoa(r.i) + " is not a string")
	return ""
}

// slots reads a comma-separated, non-empty list of slots.
func (r *reader) slots() []int {
	s := r.str()
	if r.err != nil {
		return nil
	}
	parts := strings.Split(s, ",")
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			r.fail("bad slot list " + strconv.Quote(s))
			return nil
		}
		out = append(out, n)
	}
	return out
}

// count reads a count of records of width fields each that must fit in
// the rest of the reply.
func (r *reader) count(width int) int {
	n := r.int()
	if r.err != nil {
		return 0
	}
	if n < 0 || n > int64((len(r.v)-r.i)/width) {
		r.fail("count " + strconv.FormatInt(n, 10) + " does not fit")
		return 0
	}
	return int(n)
}

// toInt parses a decimal integer, 0 if it is none (for message payloads).
func toInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// Message is a decoded message of a fair session's channel.
type Message struct {
	Kind  byte   // 'g' a grant, 'x' too heavy, 'w' the rate holds the head back, 'r' removed, 'n' the rate was set, 'h' the rate holds the queue
	ID    string // the waiter it is for
	Grant Grant  // 'g': the grant (Deadline not set: Until is the server's)
	Limit int    // 'x': the limit (or, with Rate, the rate's limit) in force
	Rate  bool   // 'x': the rate's limit, not the limit
	Wait  int64  // 'w', 'h': ms from the script's run, never negative
	At    int64  // 'n': the server time (ms) at which SetRate ran; 'h': at which the script found the hold
	Meta  string // 'n', 'h': the meta key of the semaphore
}

// ParseMessage decodes the payload of a message on a fair session's
// channel: "g id token deadline_ms slots" (a grant), "x id limit" (SetLimit
// made the limit smaller than the waiter's weight; "x id limit rate":
// SetRate made the rate's), "w id ms" (the rate holds back the head waiter
// id for ms), "r id" (an operator removed the waiter), "n at meta-key"
// (SetRate ran at server time at, ms, on the semaphore of that meta key:
// no waiter's, ID "") or "h at ms meta-key" (the rate's window holds that
// semaphore's queue for ms, as a script found at server time at: no
// waiter's). It reports false for anything else; it never panics.
func ParseMessage(payload string) (Message, bool) {
	if rest, ok := strings.CutPrefix(payload, "n "); ok {
		// The meta key last and whole: a semaphore's name may hold spaces.
		at, meta, ok := strings.Cut(rest, " ")
		if !ok || meta == "" || toInt(at) <= 0 {
			return Message{}, false
		}
		return Message{Kind: 'n', At: toInt(at), Meta: meta}, true
	}
	if rest, ok := strings.CutPrefix(payload, "h "); ok {
		at, rest, ok1 := strings.Cut(rest, " ")
		ms, meta, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 || meta == "" || toInt(at) <= 0 || toInt(ms) < 0 || (ms != "0" && toInt(ms) == 0) {
			return Message{}, false
		}
		return Message{Kind: 'h', At: toInt(at), Wait: toInt(ms), Meta: meta}, true
	}
	f := strings.Fields(payload)
	switch {
	case len(f) == 5 && f[0] == "g":
		r := reader{script: "grant message", v: []any{f[1], f[2], f[3], f[4]}}
		g := Grant{ID: r.str(), Token: r.int()}
		g.Until = r.int()
		g.Slots = r.slots()
		if r.err != nil {
			return Message{}, false
		}
		return Message{Kind: 'g', ID: g.ID, Grant: g}, true
	case len(f) == 3 && f[0] == "x":
		return Message{Kind: 'x', ID: f[1], Limit: int(toInt(f[2]))}, true
	case len(f) == 4 && f[0] == "x" && f[3] == "rate":
		return Message{Kind: 'x', ID: f[1], Limit: int(toInt(f[2])), Rate: true}, true
	case len(f) == 3 && f[0] == "w":
		return Message{Kind: 'w', ID: f[1], Wait: max(toInt(f[2]), 0)}, true
	case len(f) == 2 && f[0] == "r":
		return Message{Kind: 'r', ID: f[1]}, true
	}
	return Message{}, false
}

// ParseFree decodes a freed-slot notice of the unfair channel (the Lua
// library's notify_free): "n meta-key", n slots free in the semaphore whose
// meta key that is (a bare "n", from an older version: of any); or
// "0 meta-key ms at", slots free but the rate's window holds the next
// grant back for ms (held), as the script that ran at server time at (ms)
// found ("0 meta-key ms" from an older version: at 0, unknown). count is
// at least 1 for a notice that wakes.
func ParseFree(payload string) (count int, meta string, wait, at int64, held bool) {
	n, rest, _ := strings.Cut(payload, " ")
	if n == "0" {
		meta, rest, _ := strings.Cut(rest, " ")
		ms, at, _ := strings.Cut(rest, " ")
		return 0, meta, max(toInt(ms), 0), max(toInt(at), 0), true
	}
	return max(int(toInt(n)), 1), rest, 0, 0, false
}

// ---- grant lists ----

// grant is a grant as scripts report it in a grant list, decoded.
type Grant struct {
	ID       string
	Token    int64
	Slots    []int
	Deadline time.Time
	Until    int64 // the deadline in Redis, server ms
	// sid is the session on whose channel a grant message came ("" for a
	// grant in a script reply): the session its waiter was queued under.
	SID string
}

// decodeGrants decodes a grant list (id, token, deadline_ms, "slots", ...)
// from v[from:]; now is the server time of the reply and sent when its
// request left.
func decodeGrants(script string, v []any, from int, now int64, sent time.Time) ([]Grant, error) {
	r := reader{script: script, v: v, i: from}
	var out []Grant
	for r.more() {
		g := Grant{ID: r.str(), Token: r.int()}
		g.Until = r.int()
		g.Slots = r.slots()
		g.Deadline = expiresBy(sent, g.Until-now)
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, g)
	}
	return out, nil
}

// Grants is the grant list of a script reply, not yet decoded: most replies
// have none, and the grants of one that has are decoded only for a caller
// that has waiters to hand them to (Decode).
type Grants struct {
	script string
	v      []any
	from   int       // where the list starts in v
	now    int64     // the server time of the reply
	sent   time.Time // when its request left
}

// Now is the server time (ms) of the reply.
func (g Grants) Now() int64 { return g.now }

// Decode decodes the list; none (nil) if the reply has none or it does not
// decode (the pub/sub message, or a resync, delivers them then).
func (g Grants) Decode() []Grant {
	if len(g.v) <= g.from {
		return nil
	}
	out, err := decodeGrants(g.script, g.v, g.from, g.now, g.sent)
	if err != nil {
		return nil
	}
	return out
}
