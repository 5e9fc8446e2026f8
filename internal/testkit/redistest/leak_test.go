package redistest

import (
	"strings"
	"testing"
	"time"
)

// blockedOn stands for a goroutine a test forgot: it runs until ch closes.
func blockedOn(ch chan struct{}) { <-ch }

// The leak check reports a goroutine that keeps running, with its stack,
// unless an option leaves it out, and reports nothing once it has ended.
func TestFindLeaks(t *testing.T) {
	before := IgnoreCurrent()
	briefly := func(c *leakCheck) { c.wait = 50 * time.Millisecond }
	ch := make(chan struct{})
	go blockedOn(ch)

	leaked := findLeaks([]LeakOption{before, briefly})
	if !strings.Contains(leaked, "redistest.blockedOn(") || !strings.Contains(leaked, "[chan receive") {
		t.Fatalf("a goroutine blocked in blockedOn: reported %q", leaked)
	}
	if leaked := findLeaks([]LeakOption{before, briefly,
		IgnoreFunction("github.com/redsem/redsem/internal/testkit/redistest.blockedOn")}); leaked != "" {
		t.Fatalf("IgnoreFunction(blockedOn): still reported %q", leaked)
	}
	if leaked := findLeaks([]LeakOption{IgnoreCurrent(), briefly}); leaked != "" {
		t.Fatalf("IgnoreCurrent taken after the goroutine started: still reported %q", leaked)
	}
	close(ch)
	if leaked := findLeaks([]LeakOption{before}); leaked != "" {
		t.Fatalf("the goroutine ended: still reported %q", leaked)
	}
}
