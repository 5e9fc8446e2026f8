package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// fencedStore is one protected store: write stores value under lease's
// fence (an error matching fencing.ErrStale when rejected); read returns the
// stored value.
type fencedStore struct {
	write func(ctx context.Context, l redsem.Lease, value string) error
	read  func(ctx context.Context) string
}

func redisStore(t *testing.T, resource string) fencedStore {
	g := newRedisGuard(t, fencing.RedisOptions{})
	c := redistest.Client(t)
	key := g.DataKey(resource, "value")
	return fencedStore{
		write: func(ctx context.Context, l redsem.Lease, v string) error {
			return g.Set(ctx, fencing.Of(resource, l), key, v, 0)
		},
		read: func(ctx context.Context) string { return c.Get(ctx, key).Val() },
	}
}

func sqlStore(t *testing.T, resource string) fencedStore {
	db := pgDB(t)
	g := newSQLGuard(t, db)
	data := g.Table() + "_data"
	if _, err := db.Exec("CREATE TABLE " + data + " (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + data) })
	return fencedStore{
		write: func(ctx context.Context, l redsem.Lease, v string) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }() // no-op after Commit
			if err := g.Check(ctx, tx, fencing.Of(resource, l)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+data+" VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v", v); err != nil {
				return err
			}
			return tx.Commit()
		},
		read: func(ctx context.Context) string {
			var v string
			if err := db.QueryRowContext(ctx, "SELECT v FROM "+data+" WHERE id = 1").Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
				t.Error(err)
			}
			return v
		},
	}
}

// httpStore is a service behind Middleware (with a Redis guard) that keeps
// the last value PUT; clients send through a fencing.Transport.
func httpStore(t *testing.T, resource string) fencedStore {
	g := newRedisGuard(t, fencing.RedisOptions{})
	var (
		mu    sync.Mutex
		value string
	)
	srv := httptest.NewServer(fencing.Middleware(g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		value = string(b)
		mu.Unlock()
	})))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &fencing.Transport{}}
	return fencedStore{
		write: func(ctx context.Context, l redsem.Lease, v string) error {
			req, err := http.NewRequestWithContext(fencing.WithLease(ctx, resource, l), http.MethodPut, srv.URL, strings.NewReader(v))
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return nil
			case http.StatusConflict:
				return fmt.Errorf("http 409: %w", fencing.ErrStale)
			}
			return fmt.Errorf("http status %d", resp.StatusCode)
		},
		read: func(context.Context) string {
			mu.Lock()
			defer mu.Unlock()
			return value
		},
	}
}

// TestZombie replays the classic zombie story against each guard: A acquires (limit
// 1, no auto-renew), writes, then pauses past its lease; B acquires the same
// slot and writes; A wakes and writes: rejected as stale, B's write stands.
func TestZombie(t *testing.T) {
	for name, mk := range map[string]func(*testing.T, string) fencedStore{
		"redis": redisStore, "sql": sqlStore, "http": httpStore,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t, 20*time.Second)
			semName := redistest.Name(t)
			store := mk(t, "resource-"+semName)
			// A and B are separate clients, as if in two processes.
			opts := unfair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true}
			semA, err := unfair.New(redistest.Client(t), semName, 1, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer semA.Close()
			semB, err := unfair.New(redistest.Client(t), semName, 1, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer semB.Close()

			a, err := semA.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.write(ctx, a, "A1"); err != nil {
				t.Fatalf("A's write while holding: %v", err)
			}
			// A pauses; B's Acquire returns only once A's lease has expired.
			b, err := semB.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if b.Slot() != a.Slot() || b.Token() <= a.Token() {
				t.Fatalf("B slot %d token %d; A slot %d token %d", b.Slot(), b.Token(), a.Slot(), a.Token())
			}
			if err := store.write(ctx, b, "B"); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			// A wakes, unaware that its lease is gone, and writes.
			if err := store.write(ctx, a, "A2"); !errors.Is(err, fencing.ErrStale) {
				t.Fatalf("zombie write: %v, want ErrStale", err)
			}
			if err := a.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
				t.Fatalf("A.Renew: %v, want ErrLeaseLost", err)
			}
			if got := store.read(ctx); got != "B" {
				t.Fatalf("stored %q, want B's write", got)
			}
			// B keeps writing with its own token.
			if err := store.write(ctx, b, "B2"); err != nil {
				t.Fatalf("B's second write: %v", err)
			}
			if got := store.read(ctx); got != "B2" {
				t.Fatalf("stored %q, want B2", got)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOtherSlotsUndisturbed: with limit 3 the three live holders present
// tokens in any order and none is rejected, although two are below the
// highest token the store has seen; once a slot changes hands, only its old
// holder is rejected.
func TestOtherSlotsUndisturbed(t *testing.T) {
	ctx := redistest.Ctx(t, 20*time.Second)
	g := newRedisGuard(t, fencing.RedisOptions{MaxSlots: 3})
	sem, err := unfair.New(redistest.Client(t), redistest.Name(t), 3, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	res := redistest.Name(t)
	var leases []redsem.Lease
	for i := 0; i < 3; i++ {
		l, err := sem.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		leases = append(leases, l)
	}
	for _, i := range []int{2, 0, 1, 0, 2, 1} { // highest token first
		if err := g.Check(ctx, fencing.Of(res, leases[i])); err != nil {
			t.Fatalf("live holder %d (slot %d, token %d): %v", i, leases[i].Slot(), leases[i].Token(), err)
		}
	}
	// leases[0]'s slot changes hands (released here; expiry is the same to
	// the store): its old holder is rejected, the other slots are not.
	if err := leases[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Slot() != leases[0].Slot() {
		t.Fatalf("new lease got slot %d, want the freed slot %d", next.Slot(), leases[0].Slot())
	}
	if err := g.Check(ctx, fencing.Of(res, next)); err != nil {
		t.Fatal(err)
	}
	wantStale(t, g.Check(ctx, fencing.Of(res, leases[0])), next.Token())
	for _, l := range leases[1:] {
		if err := g.Check(ctx, fencing.Of(res, l)); err != nil {
			t.Fatalf("holder of slot %d rejected: %v", l.Slot(), err)
		}
	}
}

// TestZombieWeighted: lease A holds all three slots (AcquireN), writes,
// and pauses past its lease. B takes one of A's slots, not A's first one
// (a lease that B takes first and releases unused covers the first), and
// writes. A wakes and writes: rejected, because one of its slots has a
// newer holder, although its first slot has none. B's write stands.
func TestZombieWeighted(t *testing.T) {
	type newSem func(c *redis.Client, name string) (redsem.Semaphore, error)
	sems := []struct {
		name string
		new  newSem
	}{
		{"unfair", func(c *redis.Client, name string) (redsem.Semaphore, error) {
			return unfair.New(c, name, 3, unfair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true})
		}},
		{"fair", func(c *redis.Client, name string) (redsem.Semaphore, error) {
			return fair.New(c, name, 3, fair.Options{LeaseTTL: 300 * time.Millisecond, DisableAutoRenew: true})
		}},
	}
	stores := []struct {
		name string
		mk   func(*testing.T, string) fencedStore
	}{{"redis", redisStore}, {"sql", sqlStore}, {"http", httpStore}}
	for _, sv := range sems {
		for _, st := range stores {
			t.Run(sv.name+"/"+st.name, func(t *testing.T) {
				t.Parallel()
				ctx := redistest.Ctx(t, 20*time.Second)
				semName := redistest.Name(t)
				store := st.mk(t, "resource-"+semName)
				semA, err := sv.new(redistest.Client(t), semName)
				if err != nil {
					t.Fatal(err)
				}
				defer semA.Close()
				semB, err := sv.new(redistest.Client(t), semName)
				if err != nil {
					t.Fatal(err)
				}
				defer semB.Close()

				a, err := semA.AcquireN(ctx, 3)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(a.Slots(), []int{0, 1, 2}) {
					t.Fatalf("A holds %v, want [0 1 2]", a.Slots())
				}
				if err := store.write(ctx, a, "A1"); err != nil {
					t.Fatalf("A's write while holding: %v", err)
				}
				// A pauses; B's Acquire returns once A's lease has expired.
				first, err := semB.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				b, err := semB.TryAcquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if b.Slot() == a.Slot() { // B writes with the other one
					first, b = b, first
				}
				if b.Slot() == a.Slot() || !slices.Contains(a.Slots(), b.Slot()) || b.Token() <= a.Token() {
					t.Fatalf("B's leases: slots %d, %d; A's slots %v", first.Slot(), b.Slot(), a.Slots())
				}
				if err := first.Release(ctx); err != nil { // never wrote
					t.Fatal(err)
				}
				if err := store.write(ctx, b, "B"); err != nil {
					t.Fatalf("B's write: %v", err)
				}
				// A wakes, unaware that its lease is gone, and writes.
				if err := store.write(ctx, a, "A2"); !errors.Is(err, fencing.ErrStale) {
					t.Fatalf("zombie write (slots %v, B has slot %d): %v, want ErrStale", a.Slots(), b.Slot(), err)
				}
				if err := a.Renew(ctx); !errors.Is(err, redsem.ErrLeaseLost) {
					t.Fatalf("A.Renew: %v, want ErrLeaseLost", err)
				}
				if got := store.read(ctx); got != "B" {
					t.Fatalf("stored %q, want B's write", got)
				}
				if err := store.write(ctx, b, "B2"); err != nil {
					t.Fatalf("B's second write: %v", err)
				}
				if got := store.read(ctx); got != "B2" {
					t.Fatalf("stored %q, want B2", got)
				}
				if err := b.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestZombieWeightedFirstSlotIsNotEnough shows why a weighted fence names
// every slot: the zombie's first slot alone has no newer holder in the
// store, so a fence of that slot would be accepted; its full fence is not.
func TestZombieWeightedFirstSlotIsNotEnough(t *testing.T) {
	ctx := redistest.Ctx(t, 10*time.Second)
	g := newRedisGuard(t, fencing.RedisOptions{})
	sem, err := unfair.New(redistest.Client(t), redistest.Name(t), 3, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	res := redistest.Name(t)
	a, err := sem.TryAcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, fencing.Of(res, a)); err != nil {
		t.Fatal(err)
	}
	// A's slots change hands (released here; expiry is the same to the
	// store): one lease takes 0 and 1 and never writes, another takes 2.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	quiet, err := sem.TryAcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Release(ctx)
	b, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Slot() != 2 || a.Slot() != 0 {
		t.Fatalf("A's first slot %d, B's slot %d; want 0 and 2", a.Slot(), b.Slot())
	}
	if err := g.Check(ctx, fencing.Of(res, b)); err != nil {
		t.Fatal(err)
	}
	err = g.Check(ctx, fencing.Of(res, a))
	var se *fencing.StaleError
	if !errors.As(err, &se) || se.Slot != 2 || se.Highest != b.Token() {
		t.Fatalf("zombie's full fence: %v, want stale for slot 2 with B's token", err)
	}
	firstOnly := fencing.Fence{Resource: res, Slot: a.Slot(), Token: a.Token()}
	if err := g.Check(ctx, firstOnly); err != nil {
		t.Fatalf("first-slot-only fence: %v; the point is that it would pass", err)
	}
}
