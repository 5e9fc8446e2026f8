package wire

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzReply builds a script reply from fuzz input: fields separated by ";",
// each an int64 when it parses as one, nil for "nil", a float for "f:x", a
// bool for "b:", an error for "e:", a nested array for "[a,b,...]" (its
// elements built the same way), else the string itself. Redis replies reach
// the decoders as int64, string, nil and []any; the other types stand for a
// server or client that answers something else.
func fuzzReply(s string) []any {
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ";")
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		out = append(out, fuzzField(p, 0))
	}
	return out
}

func fuzzField(p string, depth int) any {
	if n, err := strconv.ParseInt(p, 10, 64); err == nil {
		return n
	}
	switch {
	case p == "nil":
		return nil
	case strings.HasPrefix(p, "f:"):
		f, _ := strconv.ParseFloat(p[2:], 64)
		return f
	case strings.HasPrefix(p, "b:"):
		return len(p) > 2
	case strings.HasPrefix(p, "e:"):
		return errors.New(p[2:])
	case depth < 3 && len(p) >= 2 && p[0] == '[' && p[len(p)-1] == ']':
		var out []any
		for _, q := range strings.Split(p[1:len(p)-1], ",") {
			out = append(out, fuzzField(q, depth+1))
		}
		return out
	}
	return p
}

// checkReplyErr fails unless err is nil or a *ReplyError.
func checkReplyErr(t *testing.T, what string, err error) {
	t.Helper()
	var re *ReplyError
	if err != nil && !errors.As(err, &re) {
		t.Fatalf("%s: error %v (%T), want a *ReplyError", what, err, err)
	}
	if re != nil && re.Error() == "" {
		t.Fatalf("%s: empty error text", what)
	}
}

// FuzzDecode feeds arbitrary replies to every script-reply decoder and
// arbitrary payloads to the session-message parser: none may panic, every
// error must be a *ReplyError, and what they accept must be well-formed
// (a grant has at least one slot, none negative). The seeds are real
// replies and messages of the scripts, so plain `go test` runs them; see
// docs/testing.md for a longer fuzzing run.
func FuzzDecode(f *testing.F) {
	seeds := []struct{ reply, payload string }{
		// acquire.lua: granted (one and three slots), queued, not queued,
		// mismatch, cancelled, weight, queue full.
		{"1;1764680000123;1764680000123456;1764680030123;0", "g 0b6f1c3e-5a4d-4d7e-9a51-6a1e2f3b4c5d 1764680000123456 1764680030123 0"},
		{"1;1764680000123;1764680000123999;1764680030123;0;1;2", "g 0b6f1c3e-5a4d-4d7e-9a51-6a1e2f3b4c5d 1764680000123999 1764680030123 0,1,2"},
		{"0;1764680000123;2870;3", "x 0b6f1c3e-5a4d-4d7e-9a51-6a1e2f3b4c5d 2"},
		{"0;1764680000123;-1;-1", "r 0b6f1c3e-5a4d-4d7e-9a51-6a1e2f3b4c5d"},
		{"-1;1764680000123;5", "3"},
		{"-2;1764680000123", ""},
		{"-3;1764680000123;2", "g a b c d"},
		{"-4;1764680000123;100", "g id 1 2 -1"},
		// status.lua: one holder with two slots, one waiter; empty.
		{"2;1764680000123;1;lease-1;0,1;1764680000123456;1764680030123;host:42;1;wait-1;1;1764680010123;host:43", "g id 9223372036854775807 -9223372036854775808 0,,1"},
		{"1;1764680000123;0;0", "g  id 1 2 3"},
		// release.lua / setlimit.lua / heartbeat.lua with grant lists.
		{"1;1764680000123;wait-1;1764680000124000;1764680030123;0", "x id notanumber"},
		{"1764680000123;wait-1;1764680000124000;1764680030123;0,1;wait-2;1764680000124001;1764680030123;2", "r"},
		// odd shapes
		{"[1,2];nil;f:1.5;b:x;e:boom", "g id 1 2 [0]"},
		{"1;1;1;1;[0]", "\x00 \t\n"},
		{"0;nil;nil;nil", "g id 1 2 0,-1"},
		{"2;1;3;a;0;1;1;o", "g id 1 2 99999999999999999999"},
	}
	for _, s := range seeds {
		for _, from := range []int{0, 1, 2, 3} {
			f.Add(s.reply, s.payload, from)
		}
	}
	f.Fuzz(func(t *testing.T, reply, payload string, from int) {
		v := fuzzReply(reply)
		sent := time.Now()

		a, err := decodeAttempt(v, sent)
		checkReplyErr(t, "decodeAttempt", err)
		if err == nil {
			switch a.Code {
			case CodeGranted:
				if len(a.Slots) == 0 {
					t.Fatalf("decodeAttempt(%v): granted without slots", v)
				}
				for _, s := range a.Slots {
					if s < 0 {
						t.Fatalf("decodeAttempt(%v): negative slot %d", v, s)
					}
				}
			case CodeQueued, codeMismatch, codeCancelled, codeWeight, codeQueueFull:
			default:
				t.Fatalf("decodeAttempt(%v): accepted unknown code %d", v, a.Code)
			}
		}

		// decodeGrants is called with a fixed offset inside the reply; any
		// offset from 0 to just past the end must be safe.
		if from < 0 {
			from = -from
		}
		if from < 0 { // the smallest int
			from = 0
		}
		from %= len(v) + 2
		gs, err := decodeGrants("fuzz", v, from, 0, sent)
		checkReplyErr(t, "decodeGrants", err)
		for _, g := range gs {
			if len(g.Slots) == 0 {
				t.Fatalf("decodeGrants(%v, %d): grant %q without slots", v, from, g.ID)
			}
		}

		st, err := decodeStatus(v)
		checkReplyErr(t, "decodeStatus", err)
		if err == nil {
			for _, h := range st.Holders {
				if len(h.Slots) == 0 || h.Slot != h.Slots[0] {
					t.Fatalf("decodeStatus(%v): holder %+v", v, h)
				}
			}
		}

		// The reader's primitives in the order the other decoders (renew,
		// release, setlimit, heartbeat) use them.
		r := reader{script: "fuzz", v: v}
		r.int()
		r.str()
		r.slots()
		r.count(4)
		r.int()
		checkReplyErr(t, "reader", r.err)

		m, ok := ParseMessage(payload)
		if ok {
			if (m.Kind == 'n' || m.Kind == 'h') && (m.Meta == "" || m.At <= 0 || m.Wait < 0) {
				t.Fatalf("ParseMessage(%q): a rate message without its time or key", payload)
			}
			if m.ID == "" && m.Kind != 'n' && m.Kind != 'h' {
				t.Fatalf("ParseMessage(%q): no id", payload)
			}
			if m.Kind == 'g' && len(m.Grant.Slots) == 0 {
				t.Fatalf("ParseMessage(%q): grant without slots", payload)
			}
		}
	})
}
