package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
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
type SQLGuard struct {
	table    string
	maxSlots int
	check    string
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
	return &SQLGuard{table: table, maxSlots: opts.MaxSlots, check: fmt.Sprintf(
		`INSERT INTO %[1]s (resource, slot, token) VALUES ($1, $2, $3) `+
			`ON CONFLICT (resource, slot) DO UPDATE SET token = EXCLUDED.token `+
			`WHERE %[1]s.token <= EXCLUDED.token`, table)}, nil
}

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

// CheckSQL is the conditional statement Check runs, with parameters $1
// resource, $2 slot, $3 token. It inserts or raises the slot's token and
// affects one row, or affects no row when a higher token is recorded.
func (g *SQLGuard) CheckSQL() string { return g.check }

// Check runs CheckSQL on db (a *sql.Tx to check inside your transaction)
// and returns nil when one row was affected: f.Token is recorded (a higher
// or equal token was not there). It returns a *StaleError (Highest 0) when
// no row was affected, an *InvalidFenceError for bad input before any I/O,
// and the driver's error otherwise. After a stale result roll back the
// transaction, or commit it: the statement changed nothing.
func (g *SQLGuard) Check(ctx context.Context, db Execer, f Fence) error {
	if err := f.validate(g.maxSlots); err != nil {
		return err
	}
	res, err := db.ExecContext(ctx, g.check, f.Resource, f.Slot, f.Token)
	if err != nil {
		return fmt.Errorf("fencing: sql guard: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fencing: sql guard: rows affected: %w", err)
	}
	if n == 0 {
		return &StaleError{Fence: f}
	}
	return nil
}

// On returns a Guard that checks with g on db, for use where a Guard is
// wanted (Middleware). With a *sql.DB each check commits on its own.
func (g *SQLGuard) On(db Execer) Guard {
	return GuardFunc(func(ctx context.Context, f Fence) error { return g.Check(ctx, db, f) })
}
