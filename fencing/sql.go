package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Execer runs one SQL statement. *sql.DB, *sql.Tx and *sql.Conn satisfy it;
// for pgx (pgx.Tx, *pgxpool.Pool, *pgx.Conn) use ExecFunc.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ExecFunc adapts a driver whose Exec does not return a sql.Result, such as
// pgx, to Execer. It runs query and returns how many rows it affected:
//
//	ex := fencing.ExecFunc(func(ctx context.Context, q string, args ...any) (int64, error) {
//		tag, err := tx.Exec(ctx, q, args...) // tx is a pgx.Tx
//		return tag.RowsAffected(), err
//	})
type ExecFunc func(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)

// ExecContext calls fn and wraps its row count in a sql.Result.
func (fn ExecFunc) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	n, err := fn(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rowsAffected(n), nil
}

type rowsAffected int64

func (n rowsAffected) LastInsertId() (int64, error) {
	return 0, errors.New("fencing: LastInsertId not supported")
}
func (n rowsAffected) RowsAffected() (int64, error) { return int64(n), nil }

// SQLOptions configures a SQLGuard. The zero value is valid.
type SQLOptions struct {
	// Table is the fence table, optionally schema-qualified; zero:
	// "redsem_fence". Letters, digits and underscores only (unquoted
	// identifiers), so that it is safe to put in SQL text.
	Table string
	// MaxSlots, when > 0, makes the guard reject slots >= MaxSlots with an
	// *InvalidFenceError; zero: only slot >= 0 is checked.
	MaxSlots int
	// MaxSkew is how far a token may be ahead of the database's clock
	// (clock_timestamp(), read by the statement itself): a token above it
	// in microseconds plus MaxSkew is from the future, and Check refuses it
	// with an *InvalidFenceError (Field "token") and records nothing. Zero:
	// DefaultMaxSkew (one minute). Negative: no bound (not recommended). It
	// must exceed how far the semaphore's Redis clock can be ahead of the
	// database's; see DefaultMaxSkew.
	MaxSkew time.Duration
}

// SQLGuard fences writes to PostgreSQL with one table (see CreateTableSQL)
// that holds the highest token per (resource, slot), and one conditional
// statement (CheckSQL) run in the caller's own transaction, so that the
// check and the caller's write commit or roll back together. It holds no
// connection and is safe for concurrent use.
//
// In a transaction the statement locks the (resource, slot) row until
// commit or rollback: a concurrent writer of the same slot waits, then
// re-checks against the committed token (READ COMMITTED). Under REPEATABLE
// READ or SERIALIZABLE, PostgreSQL may instead fail one of two concurrent
// transactions with a serialization error, which the caller retries as
// usual.
//
// A weighted fence (several slots) is checked by CheckSlotsSQL, one
// statement that records the token for every slot or for none, locking the
// rows in ascending slot order (so that two weighted checks cannot
// deadlock); see CheckSlotsSQL and docs/fencing.md for why concurrent
// checks cannot interleave into a partial record.
//
// Tokens are microseconds of the semaphore's Redis clock, so both
// statements refuse a token more than MaxSkew ahead of the database's own
// clock (see SQLOptions.MaxSkew): this assumes both clocks agree within
// MaxSkew.
type SQLGuard struct {
	table      string
	maxSlots   int
	skew       time.Duration // resolved: -1 for none
	check      string
	checkSlots string
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// NewSQLGuard returns a SQL guard. It does no I/O; it returns an
// *InvalidFenceError for a table name that is not a plain (optionally
// schema-qualified) identifier, or a negative MaxSlots.
func NewSQLGuard(opts SQLOptions) (*SQLGuard, error) {
	table := opts.Table
	if table == "" {
		table = "redsem_fence"
	}
	if !identRe.MatchString(table) {
		return nil, &InvalidFenceError{Field: "SQLOptions.Table", Value: table,
			Reason: "not an identifier of letters, digits and underscores (optionally schema.table)"}
	}
	if opts.MaxSlots < 0 {
		return nil, &InvalidFenceError{Field: "SQLOptions.MaxSlots", Value: strconv.Itoa(opts.MaxSlots), Reason: "negative"}
	}
	skew := maxSkew(opts.MaxSkew)
	token := "$3::bigint"
	if skew >= 0 {
		token = fmt.Sprintf(tokenSQL, skew.Microseconds(), futureMarker)
	}
	return &SQLGuard{table: table, maxSlots: opts.MaxSlots, skew: skew,
		check: fmt.Sprintf(
			`INSERT INTO %[1]s (resource, slot, token) SELECT $1::text, $2::int, %[2]s `+
				`ON CONFLICT (resource, slot) DO UPDATE SET token = EXCLUDED.token `+
				`WHERE %[1]s.token <= EXCLUDED.token`, table, token),
		checkSlots: fmt.Sprintf(checkSlotsSQL, table, token),
	}, nil
}

// tokenSQL is the token that the statements insert when MaxSkew bounds it;
// %[1]d is MaxSkew in microseconds, %[2]s futureMarker. It is $3 when $3 is
// at most the database clock (clock_timestamp(), the time of the statement
// itself, not of its transaction) in microseconds plus MaxSkew. Otherwise
// it casts a text naming the token and the clock to bigint, which fails
// with invalid_text_representation (SQLSTATE 22P02), aborting the
// statement before it writes anything: the only way one plain SQL
// statement can refuse with its own message. The text depends on
// clock_timestamp(), a volatile function, so PostgreSQL cannot fold it at
// plan time; it is cast only when the token is from the future.
const tokenSQL = `CASE WHEN $3::bigint <= ` +
	`floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint + %[1]d THEN $3::bigint ` +
	`ELSE ('%[2]s ' || $3::bigint || ' is more than %[1]d us ahead of the database clock ' || ` +
	`clock_timestamp())::bigint END`

// futureMarker starts the text that tokenSQL fails to cast for a token from
// the future; Check recognises the error by it.
const futureMarker = "redsem-fence: token"

// sqlStateBadText is PostgreSQL's invalid_text_representation: tokenSQL's
// way of refusing a token from the future.
const sqlStateBadText = "22P02"

// checkSlotsSQL is the weighted check; %[1]s is the table, %[2]s the token
// ($3, or tokenSQL). How it stays all or nothing under concurrency (READ
// COMMITTED, PostgreSQL's default):
//
//  1. NOT EXISTS reads the statement's snapshot without locking. If some
//     slot already has a committed higher token there, the SELECT yields no
//     row: nothing is inserted, updated or locked, and the statement
//     affects 0 rows. This is the usual way a zombie is rejected.
//  2. Otherwise the INSERT takes the slots in ascending order (ORDER BY).
//     For each it either inserts the row or, on conflict, locks the
//     existing row (waiting for a concurrent transaction that inserted or
//     updated it to end) and evaluates DO UPDATE against the row's latest
//     committed version, not the snapshot. The DO UPDATE has no WHERE: a
//     recorded token that is not above ours is raised to ours, and a higher
//     one, which a concurrent check committed after our snapshot was taken,
//     makes the CASE yield NULL, which the NOT NULL constraint refuses. That
//     error aborts the whole statement, undoing the rows it had already
//     written: there is no path on which some slots are written and others
//     skipped, so the statement affects either every slot's row or none.
//  3. Every check locks its rows in ascending slot order and waits only for
//     the row it is at, so two such checks never wait for each other in a
//     cycle: no deadlock between them (a caller's transaction that holds
//     other locks of the table can still deadlock, as any transaction).
//
// Parameters are text and cast in SQL so that any driver can pass them.
const checkSlotsSQL = `INSERT INTO %[1]s AS cur (resource, slot, token) ` +
	`SELECT $1::text, s.slot, %[2]s FROM unnest($2::text::int[]) AS s(slot) ` +
	`WHERE NOT EXISTS (SELECT 1 FROM %[1]s ` +
	`WHERE resource = $1::text AND slot = ANY($2::text::int[]) AND token > $3::bigint) ` +
	`ORDER BY s.slot ` +
	`ON CONFLICT (resource, slot) DO UPDATE ` +
	`SET token = CASE WHEN cur.token <= EXCLUDED.token THEN EXCLUDED.token END`

// sqlStateNotNull is PostgreSQL's not_null_violation: checkSlotsSQL's way of
// refusing a token that a concurrent check made stale.
const sqlStateNotNull = "23502"

// Table is the fence table's name.
func (g *SQLGuard) Table() string { return g.table }

// CreateTableSQL is the DDL of the fence table (CREATE TABLE IF NOT EXISTS).
func (g *SQLGuard) CreateTableSQL() string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	resource text   NOT NULL,
	slot     int    NOT NULL CHECK (slot >= 0),
	token    bigint NOT NULL CHECK (token > 0),
	PRIMARY KEY (resource, slot)
)`, g.table)
}

// CreateTable runs CreateTableSQL on db.
func (g *SQLGuard) CreateTable(ctx context.Context, db Execer) error {
	if _, err := db.ExecContext(ctx, g.CreateTableSQL()); err != nil {
		return fmt.Errorf("fencing: create table %s: %w", g.table, err)
	}
	return nil
}

// CheckSQL is the conditional statement Check runs for a fence of one
// slot, with parameters $1 resource, $2 slot, $3 token. It inserts or
// raises the slot's token and affects one row, or affects no row when a
// higher token is recorded. Unless MaxSkew is negative, it fails with
// invalid_text_representation (SQLSTATE 22P02, the message beginning
// "invalid input syntax for type bigint: "redsem-fence: token") and writes
// nothing when the token is more than MaxSkew ahead of the database clock.
func (g *SQLGuard) CheckSQL() string { return g.check }

// CheckSlotsSQL is the statement Check runs for a weighted fence, with
// parameters $1 resource, $2 the slots as a PostgreSQL array literal in text
// (ascending, no duplicates: "{0,3,4}"), $3 token. It inserts or raises the
// token of every slot and affects one row per slot, when no slot has a
// higher token recorded. Otherwise it writes nothing: it affects no row
// when the higher token was committed before the statement began, and
// fails with a not_null_violation (SQLSTATE 23502) on the token column when
// a concurrent check recorded it while the statement ran (an error aborts
// the statement as a whole, which is what keeps it all or nothing; in a
// transaction it also aborts the transaction). A token from the future
// fails it as it fails CheckSQL.
func (g *SQLGuard) CheckSlotsSQL() string { return g.checkSlots }

// Check runs CheckSQL (one slot) or CheckSlotsSQL (a weighted fence) on db
// (a *sql.Tx to check inside your transaction) and returns nil when the
// token was recorded for every slot of f (no slot had a higher one). It
// returns a *StaleError (Highest 0) when a slot has a higher token, and then
// recorded nothing for any slot; an *InvalidFenceError for bad input before
// any I/O, and, recording nothing, for a token more than MaxSkew ahead of
// the database clock (the statement failed: in a transaction, roll it
// back); and the driver's error otherwise.
//
// After a stale result roll back the transaction. For one slot, or when the
// higher token was committed before the check began, the statement changed
// nothing and the transaction may also go on; but when a concurrent check
// of the same slots recorded a higher token while a weighted check ran, the
// statement failed to stay all or nothing, and PostgreSQL has aborted the
// transaction (the *StaleError then wraps the driver's error).
func (g *SQLGuard) Check(ctx context.Context, db Execer, f Fence) error {
	if err := f.validate(g.maxSlots); err != nil {
		return err
	}
	if !f.weighted() {
		res, err := db.ExecContext(ctx, g.check, f.Resource, f.Slot, f.Token)
		if err != nil {
			return g.execError(f, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("fencing: sql guard: rows affected: %w", err)
		}
		if n == 0 {
			return &StaleError{Fence: f, Slot: f.Slot}
		}
		return nil
	}
	res, err := db.ExecContext(ctx, g.checkSlots, f.Resource, "{"+formatSlots(f.Slots)+"}", f.Token)
	if err != nil {
		var pe interface{ SQLState() string }
		if errors.As(err, &pe) && pe.SQLState() == sqlStateNotNull {
			return &StaleError{Fence: f, Slot: -1, Err: err}
		}
		return g.execError(f, err)
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("fencing: sql guard: rows affected: %w", err)
	case n == 0:
		return &StaleError{Fence: f, Slot: -1}
	case n != int64(len(f.Slots)):
		return fmt.Errorf("fencing: sql guard: %d rows affected for %d slots", n, len(f.Slots))
	}
	return nil
}

// execError is the result of a check statement that failed with err: an
// *InvalidFenceError when the statement refused a token from the future,
// else err wrapped.
func (g *SQLGuard) execError(f Fence, err error) error {
	var pe interface{ SQLState() string }
	if g.skew >= 0 && errors.As(err, &pe) && pe.SQLState() == sqlStateBadText &&
		strings.Contains(err.Error(), futureMarker) {
		return futureError(f, 0, g.skew, "the database clock (clock_timestamp())")
	}
	return fmt.Errorf("fencing: sql guard: %w", err)
}

// On returns a Guard that checks with g on db, for use where a Guard is
// wanted (Middleware). With a *sql.DB each check commits on its own.
func (g *SQLGuard) On(db Execer) Guard {
	return GuardFunc(func(ctx context.Context, f Fence) error { return g.Check(ctx, db, f) })
}
