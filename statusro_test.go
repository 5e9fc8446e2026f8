package redsem_test

import (
	"testing"
	"time"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Status runs status.lua with EVALSHA_RO (Redis 7.0) so that it may run on
// a replica; a server without the read-only commands (Redis 6.2, here a
// Redis 7 with them renamed away) runs it as a plain script instead.
func TestStatusWithoutReadOnlyScripts(t *testing.T) {
	srv := redistest.Start(t, "--rename-command", "EVALSHA_RO", "", "--rename-command", "EVAL_RO", "")
	for _, variant := range []string{"unfair", "fair"} {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 10*time.Second)
			s := newPrefixed(t, variant, srv.Client(t), redistest.Name(t), 2, prefixed{Prefix: uniquePrefix()})
			l, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			st, err := s.Status(ctx)
			if err != nil {
				t.Fatalf("Status without EVALSHA_RO: %v", err)
			}
			if len(st.Holders) != 1 || st.Holders[0].ID != l.ID() {
				t.Fatalf("Status holders %+v, want the one lease %s", st.Holders, l.ID())
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
