package redsemsql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/detach"
)

// releaseTimeout bounds the Release made when a connection closes.
const releaseTimeout = 5 * time.Second

// NewConnector wraps a database/sql connector so that each open connection
// holds a lease of sem: across every process, at most the limit's
// connections to the database are open at once (the seed's legacy database
// with max_connections). Connect waits for a slot within its context; the
// lease is released when the connection closes; a connection whose lease
// was lost answers driver.ErrBadConn on its next use, so database/sql
// discards it and opens another.
//
// Use it with sql.OpenDB. The returned connector also implements io.Closer
// (closing base if it is an io.Closer; sem stays open, it is the caller's)
// and Driver (a driver.Driver whose Open also holds a lease).
func NewConnector(base driver.Connector, sem redsem.Semaphore) driver.Connector {
	return &connector{base: base, sem: sem}
}

type connector struct {
	base driver.Connector
	sem  redsem.Semaphore
}

var (
	_ driver.Connector = (*connector)(nil)
	_ io.Closer        = (*connector)(nil)
)

// Connect waits for a lease within ctx, then opens a connection with the
// base connector. If no lease is granted it returns an error prefixed
// "redsemsql: " that wraps the cause (errors.Is(err, ctx.Err()) when ctx
// ended) and opens nothing. If the base Connect fails, the lease is
// released and its error returned unchanged.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	return open(ctx, c.sem, func() (driver.Conn, error) { return c.base.Connect(ctx) })
}

// Driver returns a driver whose Open holds a lease as Connect does
// (waiting without a deadline), for code that calls sql.DB.Driver().Open.
func (c *connector) Driver() driver.Driver { return &leasedDriver{base: c.base.Driver(), sem: c.sem} }

// Close closes the base connector if it implements io.Closer (sql.DB.Close
// calls it); it does not close the semaphore.
func (c *connector) Close() error {
	if cl, ok := c.base.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

type leasedDriver struct {
	base driver.Driver
	sem  redsem.Semaphore
}

// Open waits for a lease, then opens a connection with the base driver.
func (d *leasedDriver) Open(name string) (driver.Conn, error) {
	return open(context.Background(), d.sem, func() (driver.Conn, error) { return d.base.Open(name) })
}

// open acquires a lease, then connects; the lease goes with the connection.
func open(ctx context.Context, sem redsem.Semaphore, connect func() (driver.Conn, error)) (driver.Conn, error) {
	lease, err := sem.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("redsemsql: acquire %q: %w", sem.Name(), err)
	}
	base, err := connect()
	if err != nil {
		release(ctx, lease)
		return nil, err
	}
	return &conn{base: base, lease: lease}, nil
}

func release(ctx context.Context, l redsem.Lease) {
	_ = detach.Release(ctx, l, releaseTimeout) // on failure the slot comes back after the lease TTL
}

// conn is a connection that holds a lease. It implements every optional
// interface that database/sql looks for; where the base connection lacks
// one, it answers as database/sql would without it (driver.ErrSkip for the
// fast paths, nil from Ping and ResetSession, true from IsValid).
type conn struct {
	base  driver.Conn
	lease redsem.Lease
	once  sync.Once
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

// lost reports whether the connection's lease was lost.
func (c *conn) lost() bool { return c.lease.Err() != nil }

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	return c.base.Prepare(query)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	if p, ok := c.base.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.base.Prepare(query)
}

// Close closes the base connection, then releases the lease (also when
// Close fails: database/sql forgets the connection either way).
func (c *conn) Close() error {
	err := c.base.Close()
	c.once.Do(func() { release(context.Background(), c.lease) })
	return err
}

func (c *conn) Begin() (driver.Tx, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	return c.base.Begin()
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	if b, ok := c.base.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	// What database/sql does for a driver without BeginTx.
	if opts.Isolation != driver.IsolationLevel(0) {
		return nil, errors.New("redsemsql: the driver does not support non-default isolation levels")
	}
	if opts.ReadOnly {
		return nil, errors.New("redsemsql: the driver does not support read-only transactions")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.base.Begin()
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	switch e := c.base.(type) {
	case driver.ExecerContext:
		return e.ExecContext(ctx, query, args)
	case driver.Execer:
		vals, err := values(args)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return e.Exec(query, vals)
	}
	return nil, driver.ErrSkip // database/sql prepares the statement instead
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.lost() {
		return nil, driver.ErrBadConn
	}
	switch q := c.base.(type) {
	case driver.QueryerContext:
		return q.QueryContext(ctx, query, args)
	case driver.Queryer:
		vals, err := values(args)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return q.Query(query, vals)
	}
	return nil, driver.ErrSkip // database/sql prepares the statement instead
}

// values turns positional named values into plain values for the
// pre-context driver interfaces; named parameters skip to a prepared
// statement, as database/sql does.
func values(args []driver.NamedValue) ([]driver.Value, error) {
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, driver.ErrSkip
		}
		vals[i] = a.Value
	}
	return vals, nil
}

func (c *conn) Ping(ctx context.Context) error {
	if c.lost() {
		return driver.ErrBadConn
	}
	if p, ok := c.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession is called by database/sql before a pooled connection is
// reused: it answers driver.ErrBadConn once the lease is lost.
func (c *conn) ResetSession(ctx context.Context) error {
	if c.lost() {
		return driver.ErrBadConn
	}
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid is called by database/sql when a connection returns to the pool:
// false once the lease is lost, so the connection is closed.
func (c *conn) IsValid() bool {
	if c.lost() {
		return false
	}
	if v, ok := c.base.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip // database/sql's default conversion
}
