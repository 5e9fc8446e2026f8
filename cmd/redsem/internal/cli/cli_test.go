package cli

import (
	"bytes"
	"strings"
	"testing"
)

// Negative numbers are positional arguments wherever they stand, and still
// the values of the flags they follow.
func TestParseNegativeNumbers(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		nargs int
		pos   string // joined by "|"
		count int
		err   string // in stderr, when a usage error is expected
	}{
		{[]string{"name", "-1"}, 2, "name|-1", 0, ""},
		{[]string{"name", "-1", "--count", "3"}, 2, "name|-1", 3, ""},
		{[]string{"--count", "3", "-1.5", "name"}, 2, "-1.5|name", 3, ""},
		{[]string{"name", "--count", "-2", "-0"}, 2, "name|-0", -2, ""},
		{[]string{"name", "-1e3"}, 2, "name|-1e3", 0, ""},
		{[]string{"name", "--", "-x"}, 2, "name|-x", 0, ""},
		{[]string{"name", "-x"}, 2, "", 0, "flag provided but not defined: -x"},
		{[]string{"name", "-1x"}, 2, "", 0, "flag provided but not defined: -1x"},
		{[]string{"name", "-1", "-2"}, 2, "", 0, "too many arguments"},
	} {
		var out, errb bytes.Buffer
		c := New("test", "NAME N", "a test", &out, &errb)
		count := c.FS.Int("count", 0, "a number")
		pos, code, stop := c.Parse(tc.args, tc.nargs, "NAME N")
		if tc.err != "" {
			if !stop || code != ExitUsage || !strings.Contains(errb.String(), tc.err) {
				t.Errorf("%q: stop %v, exit %d, stderr %q; want usage error %q", tc.args, stop, code, errb.String(), tc.err)
			}
			continue
		}
		if stop || strings.Join(pos, "|") != tc.pos || *count != tc.count {
			t.Errorf("%q: stop %v (stderr %q), pos %q, --count %d; want %q, %d", tc.args, stop, errb.String(), pos, *count, tc.pos, tc.count)
		}
	}
}
