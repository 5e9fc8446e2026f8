package human

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		time.Minute:                           "1m",
		time.Hour:                             "1h",
		90 * time.Minute:                      "1h30m",
		90 * time.Second:                      "1m30s",
		time.Hour + 5*time.Second:             "1h0m5s",
		250 * time.Millisecond:                "250ms",
		1500 * time.Millisecond:               "1.5s",
		-time.Minute:                          "-1m",
		366 * 24 * time.Hour:                  "8784h",
		time.Minute + time.Millisecond:        "1m0.001s",
		2*time.Hour + 30*time.Minute:          "2h30m",
		59*time.Second + 999*time.Millisecond: "59.999s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(Duration(d)); err != nil || back != d {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", Duration(d), back, err, d)
		}
	}
}

func TestWait(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                          "0s",
		0:                                     "0s",
		time.Microsecond:                      "1ms",
		250 * time.Millisecond:                "250ms",
		999*time.Millisecond + 1:              "1s",
		time.Second:                           "1s",
		1200 * time.Millisecond:               "2s",
		59*time.Second + 999*time.Millisecond: "60s",
		time.Minute:                           "60s",
		90 * time.Second:                      "90s",
	} {
		if got := Wait(d); got != want {
			t.Errorf("Wait(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSemaphore(t *testing.T) {
	for _, c := range [][3]string{
		{"", "db", `"db"`},
		{"tenants", "acme", `family "tenants", key "acme"`},
		{"", `a"b`, `"a\"b"`},
	} {
		if got := Semaphore(c[0], c[1]); got != c[2] {
			t.Errorf("Semaphore(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}
