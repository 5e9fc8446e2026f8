package detach

import (
	"context"
	"errors"
	"testing"
	"time"
)

// releaser records the context each Release ran with and fails while
// failing is set.
type releaser struct {
	calls   []context.Context
	failing bool
	during  func(ctx context.Context) // runs inside Release, if set
}

func (r *releaser) Release(ctx context.Context) error {
	r.calls = append(r.calls, ctx)
	if r.during != nil {
		r.during(ctx)
	}
	if r.failing {
		return errors.New("refused")
	}
	return ctx.Err()
}

type key struct{}

// While the caller's context runs, the release runs within it (its values
// kept, its cancellation honoured) and no detached one follows a failure
// that was not the context's.
func TestReleaseWithinLiveContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer cancel()
	r := &releaser{failing: true}
	if err := Release(ctx, r, time.Second); err == nil {
		t.Fatal("a refused release reported success")
	}
	if len(r.calls) != 1 {
		t.Fatalf("%d releases, want 1 within the caller's context", len(r.calls))
	}
	if r.calls[0].Value(key{}) != "v" {
		t.Fatal("the caller's values are lost")
	}
	// The caller's context ends during the release: that one ends too, and
	// a detached one follows.
	ended := false
	r = &releaser{during: func(rctx context.Context) {
		if len(r.calls) == 1 {
			cancel()
			ended = rctx.Err() != nil
		}
	}}
	if err := Release(ctx, r, time.Second); err != nil {
		t.Fatalf("release after the context ended mid-way: %v", err)
	}
	if !ended {
		t.Fatal("the release's context did not end with the caller's")
	}
	if len(r.calls) != 2 || r.calls[1].Value(key{}) != "v" {
		t.Fatalf("%d releases, want the first within the context and a detached second with its values", len(r.calls))
	}
}

// Once the caller's context has ended, the release runs on a detached
// context that keeps the values and is bounded by d.
func TestReleaseAfterContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	cancel()
	r := &releaser{}
	if err := Release(ctx, r, 50*time.Millisecond); err != nil {
		t.Fatalf("detached release: %v", err)
	}
	if len(r.calls) != 1 {
		t.Fatalf("%d releases, want 1 detached", len(r.calls))
	}
	d, ok := r.calls[0].Deadline()
	if !ok || time.Until(d) > 50*time.Millisecond {
		t.Fatalf("detached release not bounded by d: deadline %v %v", d, ok)
	}
	if r.calls[0].Value(key{}) != "v" {
		t.Fatal("the caller's values are lost")
	}
}
