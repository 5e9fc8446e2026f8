package redsem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A SetLimit whose reply is lost is sent again by go-redis; the second copy
// must not undo a SetLimit that another client made after the first copy
// took effect (a lost update: an operator's SetLimit silently reverted by
// another process's network hiccup). Found by the linearizability checker
// (property_test, retried histories); this is its deterministic form.
//
// Client A talks through a proxy that loses the reply to A's SetLimit(4)
// after Redis ran it; go-redis retries after a 500 ms backoff. Meanwhile B
// sees limit 4 and sets 1. A's call returns nil. Every order of the three
// calls that respects real time puts A's SetLimit(4) before B's SetLimit(1)
// (B saw its effect), so the limit in force must end as 1.
func TestResentSetLimitDoesNotUndoLaterSetLimit(t *testing.T) {
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			srv := redistest.Shared(t)
			proxy := redistest.StartProxy(t, srv.Addr)
			opt := srv.Options()
			opt.Addr = proxy.Addr
			opt.MaxRetries = 1
			opt.MinRetryBackoff, opt.MaxRetryBackoff = 500*time.Millisecond, 500*time.Millisecond
			ca := redis.NewClient(opt)
			t.Cleanup(func() { _ = ca.Close() })
			name := redistest.Name(t)
			o := prefixed{Prefix: uniquePrefix(), LeaseTTL: 10 * time.Second}
			a := newPrefixed(t, variant, ca, name, 2, o)
			b := newPrefixed(t, variant, redistest.Client(t), name, 2, o)

			// A first SetLimit opens A's connection (the handshake goes
			// through the proxy too) and loads whatever script SetLimit
			// runs, so that the reply lost below is the one of the call
			// that takes effect.
			if err := a.SetLimit(ctx, 3); err != nil {
				t.Fatal(err)
			}
			settled(ctx, t, a) // and loads the function library, if the server takes it
			proxy.DropNext(1)
			aDone := make(chan error, 1)
			go func() { aDone <- a.SetLimit(ctx, 4) }()
			waitUntil(ctx, t, "A's SetLimit(4) took effect", func() bool {
				st, err := b.Status(ctx)
				return err == nil && st.Limit == 4
			})
			if err := b.SetLimit(ctx, 1); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-aDone:
				t.Fatalf("A's SetLimit returned (%v) before B's SetLimit: the retry backoff is too short to arrange the case", err)
			default:
			}
			if err := <-aDone; err != nil && !errors.Is(err, redis.ErrClosed) {
				t.Logf("A's SetLimit: %v", err)
			}
			st, err := b.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Limit != 1 {
				t.Errorf("limit in force %d after A's SetLimit(4) (seen by B) and then B's SetLimit(1): the re-sent SetLimit(4) undid B's", st.Limit)
			}
		})
	}
}
