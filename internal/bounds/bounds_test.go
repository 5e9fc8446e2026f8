package bounds

import (
	"context"
	"testing"
	"time"
)

// The backoff doubles from 20 ms up to a second, each pause within
// [0.5d, 1.5d).
func TestBackoff(t *testing.T) {
	var b Backoff
	for i, d := range []time.Duration{20, 40, 80, 160, 320, 640, 1000, 1000} {
		d *= time.Millisecond
		if got := b.Next(); got < d/2 || got >= d+d/2 {
			t.Fatalf("pause %d: %v, want within [%v, %v)", i, got, d/2, d+d/2)
		}
	}
}

func TestJitter(t *testing.T) {
	for range 1000 {
		if got := Jitter(time.Second, 0.2); got < 800*time.Millisecond || got >= 1200*time.Millisecond {
			t.Fatalf("Jitter(1s, 0.2) = %v", got)
		}
	}
}

func TestLeaseBounds(t *testing.T) {
	for _, c := range []struct{ ttl, expire, renew time.Duration }{
		{time.Millisecond, time.Millisecond, time.Millisecond},
		{500 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		{30 * time.Second, 100 * time.Millisecond, time.Second},
	} {
		if got := ExpireRelease(c.ttl); got != c.expire {
			t.Errorf("ExpireRelease(%v) = %v, want %v", c.ttl, got, c.expire)
		}
		if got := RenewRetry(c.ttl); got != c.renew {
			t.Errorf("RenewRetry(%v) = %v, want %v", c.ttl, got, c.renew)
		}
	}
	if got := RenewEvery(30 * time.Second); got != 10*time.Second {
		t.Errorf("RenewEvery(30s) = %v", got)
	}
	if got := RenewWindow(30 * time.Second); got != 5*time.Second {
		t.Errorf("RenewWindow(30s) = %v", got)
	}
	if got := Heartbeat(10*time.Second, time.Second); got != time.Second {
		t.Errorf("Heartbeat(10s, 1s) = %v", got)
	}
	if got := Heartbeat(900*time.Millisecond, time.Second); got != 300*time.Millisecond {
		t.Errorf("Heartbeat(900ms, 1s) = %v", got)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var b Backoff
	if b.Wait(ctx) {
		t.Fatal("Wait returned true on an ended context")
	}
}
