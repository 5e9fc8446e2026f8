package core

import "testing"

// TestParseMessage checks the messages of a fair session's channel.
func TestParseMessage(t *testing.T) {
	m, ok := parseMessage("g w1 17 1000 0,2")
	if !ok || m.id != "w1" || m.ev.kind != evGrant || m.ev.grant.Token != 17 || m.deadline != 1000 ||
		len(m.ev.grant.Slots) != 2 || m.ev.grant.Slots[1] != 2 || m.ev.grant.ID != "w1" {
		t.Fatalf("grant: %+v %v", m, ok)
	}
	if m, ok := parseMessage("x w2 3"); !ok || m.id != "w2" || m.ev.kind != evWeight || m.ev.limit != 3 {
		t.Fatalf("weight: %+v %v", m, ok)
	}
	if m, ok := parseMessage("r w3"); !ok || m.id != "w3" || m.ev.kind != evRequeue {
		t.Fatalf("requeue: %+v %v", m, ok)
	}
	if m, ok := parseMessage("w w4 250"); !ok || m.id != "w4" || m.ev.kind != evWake || m.ev.wait != 250 {
		t.Fatalf("wake: %+v %v", m, ok)
	}
	// The rate was set: the meta key last and whole (a name may hold spaces).
	if m, ok := parseMessage("n 1765000000123 redsem:{a b}:meta"); !ok || m.id != "" || m.ev.kind != evRateSet ||
		m.ev.at != 1765000000123 || m.meta != "redsem:{a b}:meta" {
		t.Fatalf("rate set: %+v %v", m, ok)
	}
	// The window holds the queue: ms, then the meta key last and whole.
	if m, ok := parseMessage("h 1765000000123 950 redsem:{a b}:meta"); !ok || m.id != "" || m.ev.kind != evRateHeld ||
		m.ev.at != 1765000000123 || m.ev.wait != 950 || m.meta != "redsem:{a b}:meta" {
		t.Fatalf("rate held: %+v %v", m, ok)
	}
	for _, bad := range []string{"", "g w1 17 1000", "g w1 x 1000 0", "g w1 1 2 a", "q w1", "r", "x w1",
		"n", "n 12", "n 12 ", "n x meta", "n 0 meta", "n -5 meta",
		"h", "h 12 5", "h 12 5 ", "h 0 5 meta", "h 12 -1 meta", "h 12 x meta"} {
		if m, ok := parseMessage(bad); ok {
			t.Fatalf("parseMessage(%q) = %+v, want false", bad, m)
		}
	}
}
