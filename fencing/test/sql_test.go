package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// newSQLGuard creates a fence table unique to the test (dropped afterwards).
func newSQLGuard(t *testing.T, db *sql.DB) *fencing.SQLGuard {
	t.Helper()
	return newSQLGuardOpts(t, db, fencing.SQLOptions{})
}

// newSQLGuardOpts is newSQLGuard with options; opts.Table is set to the
// test's table, which two guards of one test share.
func newSQLGuardOpts(t *testing.T, db *sql.DB, opts fencing.SQLOptions) *fencing.SQLGuard {
	t.Helper()
	table := "fence_" + strings.ToLower(strings.NewReplacer("-", "_", ".", "_", "/", "_").Replace(redistest.Name(t)))
	if len(table) > 63 {
		table = table[len(table)-63:]
		table = "f" + table[1:]
	}
	opts.Table = table
	g, err := fencing.NewSQLGuard(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := redistest.Ctx(t, 10*time.Second)
	if err := g.CreateTable(ctx, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + g.Table()) })
	return g
}

func recorded(t *testing.T, db *sql.DB, g *fencing.SQLGuard, resource string, slot int) int64 {
	t.Helper()
	var tok int64
	err := db.QueryRow("SELECT token FROM "+g.Table()+" WHERE resource = $1 AND slot = $2", resource, slot).Scan(&tok)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSQLGuardCheck(t *testing.T) {
	db := pgDB(t)
	ctx := redistest.Ctx(t, 10*time.Second)
	// No clock bound: the tokens near 2^63 below are from the future
	// (TestForgedTokenRefused checks the bound).
	g := newSQLGuardOpts(t, db, fencing.SQLOptions{MaxSkew: -1})
	r := redistest.Name(t)
	f := func(slot int, token int64) fencing.Fence { return fencing.Fence{Resource: r, Slot: slot, Token: token} }
	steps := []struct {
		fence fencing.Fence
		stale bool
	}{
		{f(0, 10), false},
		{f(0, 10), false}, // equal: the same holder writes again
		{f(0, 9), true},
		{f(1, 5), false}, // another slot
		{fencing.Fence{Resource: r + "-other", Slot: 0, Token: 1}, false},
		{f(0, 11), false},
		{f(0, 10), true},
		{f(2, math.MaxInt64), false},
		{f(2, math.MaxInt64-1), true},
	}
	for i, s := range steps {
		err := g.Check(ctx, db, s.fence)
		if !s.stale && err != nil {
			t.Fatalf("step %d %+v: %v", i, s.fence, err)
		}
		if s.stale {
			wantStale(t, err, 0)
		}
	}
	for slot, want := range map[int]int64{0: 11, 1: 5, 2: math.MaxInt64, 3: 0} {
		if got := recorded(t, db, g, r, slot); got != want {
			t.Fatalf("slot %d: recorded %d, want %d", slot, got, want)
		}
	}
}

// TestSQLGuardInTransaction: the check and the caller's write commit
// together; a stale check changes nothing; a concurrent transaction on the
// same slot waits for the row lock and then sees the committed token.
func TestSQLGuardInTransaction(t *testing.T) {
	db := pgDB(t)
	ctx := redistest.Ctx(t, 20*time.Second)
	g := newSQLGuard(t, db)
	r := redistest.Name(t)
	data := g.Table() + "_data"
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+data+" (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + data) })
	write := func(tx *sql.Tx, f fencing.Fence, v string) error {
		if err := g.Check(ctx, tx, f); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+data+" VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v", v)
		return err
	}
	// B (token 20) holds the row lock in an open transaction.
	txB, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(txB, fencing.Fence{Resource: r, Slot: 0, Token: 20}, "B"); err != nil {
		t.Fatal(err)
	}
	// A zombie (token 10) starts its transaction and blocks on the lock.
	zombie := make(chan error, 1)
	go func() {
		txA, err := db.BeginTx(ctx, nil)
		if err != nil {
			zombie <- err
			return
		}
		defer func() { _ = txA.Rollback() }()
		zombie <- write(txA, fencing.Fence{Resource: r, Slot: 0, Token: 10}, "A")
	}()
	// Wait until A is really blocked on B's lock, then commit B.
	waitFor(t, 10*time.Second, func() bool {
		var n int
		_ = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "+g.Table()+" %'").Scan(&n)
		return n > 0
	})
	if err := txB.Commit(); err != nil {
		t.Fatal(err)
	}
	wantStale(t, <-zombie, 0)
	var v string
	if err := db.QueryRowContext(ctx, "SELECT v FROM "+data+" WHERE id = 1").Scan(&v); err != nil || v != "B" {
		t.Fatalf("data %q, %v; want B", v, err)
	}
	if got := recorded(t, db, g, r, 0); got != 20 {
		t.Fatalf("recorded %d, want 20", got)
	}
	// A rolled-back check records nothing.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, tx, fencing.Fence{Resource: r, Slot: 0, Token: 30}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := recorded(t, db, g, r, 0); got != 20 {
		t.Fatalf("recorded %d after rollback, want 20", got)
	}
}

// waitFor polls cond every 10ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSQLGuardBadInput(t *testing.T) {
	for _, opts := range []fencing.SQLOptions{{Table: "x; DROP TABLE y"}, {Table: `"quoted"`}, {Table: "a.b.c"}, {MaxSlots: -1}} {
		if _, err := fencing.NewSQLGuard(opts); !errors.Is(err, fencing.ErrInvalidFence) {
			t.Fatalf("NewSQLGuard(%+v): %v", opts, err)
		}
	}
	g, err := fencing.NewSQLGuard(fencing.SQLOptions{Table: "public.some_fence", MaxSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Bad input is rejected before any I/O: this Execer fails the test if called.
	never := fencing.ExecFunc(func(context.Context, string, ...any) (int64, error) {
		t.Fatal("Execer called for bad input")
		return 0, nil
	})
	for _, tc := range []struct {
		fence fencing.Fence
		field string
	}{
		{fencing.Fence{Resource: "", Slot: 0, Token: 1}, "resource"},
		{fencing.Fence{Resource: "r", Slot: -1, Token: 1}, "slot"},
		{fencing.Fence{Resource: "r", Slot: 2, Token: 1}, "slot"},
		{fencing.Fence{Resource: "r", Slot: 0, Token: 0}, "token"},
		{fencing.Fence{Resource: "r", Slot: 0, Token: -1}, "token"},
	} {
		err := g.Check(context.Background(), never, tc.fence)
		var ie *fencing.InvalidFenceError
		if !errors.Is(err, fencing.ErrInvalidFence) || !errors.As(err, &ie) || ie.Field != tc.field {
			t.Fatalf("Check(%+v) = %v, want an *InvalidFenceError for %s", tc.fence, err, tc.field)
		}
	}
}

// TestSQLGuardConcurrent: goroutines present random tokens for the same
// resource; each slot ends with the highest token presented.
func TestSQLGuardConcurrent(t *testing.T) {
	db := pgDB(t)
	ctx := redistest.Ctx(t, 30*time.Second)
	g := newSQLGuard(t, db)
	r := redistest.Name(t)
	const workers, per, slots = 12, 40, 3
	var (
		mu      sync.Mutex
		highest [slots]int64
		wg      sync.WaitGroup
	)
	errs := make(chan error, workers*per)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				f := fencing.Fence{Resource: r, Slot: rand.IntN(slots), Token: rand.Int64N(1<<50) + 1}
				mu.Lock()
				highest[f.Slot] = max(highest[f.Slot], f.Token)
				mu.Unlock()
				if err := g.On(db).Check(ctx, f); err != nil && !errors.Is(err, fencing.ErrStale) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for slot := 0; slot < slots; slot++ {
		if got := recorded(t, db, g, r, slot); got != highest[slot] {
			t.Fatalf("slot %d: recorded %d, highest presented %d", slot, got, highest[slot])
		}
	}
}

// TestSQLGuardPgx: the ExecFunc adapter with pgx's own API, as documented.
func TestSQLGuardPgx(t *testing.T) {
	db := pgDB(t) // skips or fails when PostgreSQL is unreachable
	ctx := redistest.Ctx(t, 10*time.Second)
	g := newSQLGuard(t, db)
	url := defaultPGURL
	if u := envPGURL(); u != "" {
		url = u
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ex := fencing.ExecFunc(func(ctx context.Context, q string, args ...any) (int64, error) {
		tag, err := tx.Exec(ctx, q, args...)
		return tag.RowsAffected(), err
	})
	r := redistest.Name(t)
	if err := g.Check(ctx, ex, fencing.Fence{Resource: r, Slot: 0, Token: 7}); err != nil {
		t.Fatal(err)
	}
	wantStale(t, g.Check(ctx, ex, fencing.Fence{Resource: r, Slot: 0, Token: 6}), 0)
	// A weighted fence: the slots travel as text through pgx too.
	if err := g.Check(ctx, ex, fencing.Fence{Resource: r, Slot: 1, Slots: []int{1, 2}, Token: 8}); err != nil {
		t.Fatal(err)
	}
	wantStale(t, g.Check(ctx, ex, fencing.Fence{Resource: r, Slot: 0, Slots: []int{0, 2, 3}, Token: 7}), 0)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for slot, want := range map[int]int64{0: 7, 1: 8, 2: 8, 3: 0} {
		if got := recorded(t, db, g, r, slot); got != want {
			t.Fatalf("slot %d: recorded %d, want %d", slot, got, want)
		}
	}
}
