// Package human formats what the library's messages say as a person
// writes it: a duration without the zero units after its largest ("1m",
// not "1m0s"), a wait rounded up to whole seconds ("retry after 60s", not
// "59.999s"), and a member of a family named by its family's name with its
// key.
package human

import (
	"strconv"
	"strings"
	"time"
)

// Duration formats d as time.Duration's String does, less the zero units
// that follow its largest: "1m", "1h", "1h30m", "90s" is "1m30s", "250ms",
// "1.5s". time.ParseDuration reads it back to d.
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// Wait formats how long to wait before trying again as one would advise
// it: from a second on, rounded up to whole seconds and said in seconds,
// as an HTTP Retry-After says it ("60s" for 59.999s, "90s"); below, rounded
// up to whole milliseconds ("250ms"); "0s" for zero or less.
func Wait(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		ms := (d + time.Millisecond - 1) / time.Millisecond
		if ms < 1000 {
			return strconv.FormatInt(int64(ms), 10) + "ms"
		}
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + "s"
}

// Semaphore names a semaphore in a message: its name, quoted ("db"); for a
// member of a family (family not empty), the family's name with the
// member's key (family "tenants", key "acme").
func Semaphore(family, name string) string {
	if family == "" {
		return strconv.Quote(name)
	}
	return "family " + strconv.Quote(family) + ", key " + strconv.Quote(name)
}
