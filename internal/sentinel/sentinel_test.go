package sentinel

import (
	"errors"
	"fmt"
	"testing"
)

var (
	errA = New("a")
	errB = Register(kind{})
)

type kind struct{}

func (kind) Error() string { return "kind" }

func TestOwn(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errA, true},
		{fmt.Errorf("wrapped: %w", errA), true},
		{errB, true},
		{errors.Join(errors.New("x"), kind{}), true},
		{errors.New("a"), false}, // the same text is not the sentinel
		{nil, false},
	} {
		if got := Own(c.err); got != c.want {
			t.Errorf("Own(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
