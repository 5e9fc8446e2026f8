package core

import (
	"strconv"
	"strings"
)

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
