package redsemsql

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"runtime"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/connslots"
)

// ErrConnectTimeout is wrapped by the error of a Connect that got no slot
// within Options.ConnectTimeout (its context still running).
var ErrConnectTimeout = connslots.ErrConnectTimeout

// Options tune a connector. The zero value is valid.
type Options struct {
	// ConnectTimeout bounds the wait for a slot of a Connect whose
	// context has no deadline: database/sql's opener goroutine connects
	// with a context that never ends, and a Connect blocked there holds
	// one of MaxOpenConns until it returns. Then Connect returns an error
	// that wraps ErrConnectTimeout (database/sql hands it to a query that
	// waits for a connection). A context with a deadline (a query's, when
	// database/sql connects for it directly) is the bound instead.
	// Default 10 s; negative: only the context bounds the wait.
	ConnectTimeout time.Duration
	// MinHold: a connection keeps its slot at least this long (from its
	// grant) before it gives it back to a waiting process; 0: the default
	// (500 ms); negative: give back at once (the behaviour before MinHold
	// existed, which costs a new connection per query or two when busy
	// processes share the limit). A waiting process is served within
	// about MinHold plus a connect. It must be shorter than a bounded
	// ConnectTimeout: otherwise every Connect (and Driver().Open) returns
	// a *redsem.ConfigError at once, opening nothing.
	MinHold time.Duration
}

// NewConnector wraps a database/sql connector so that each open connection
// holds a lease of sem: across every process, at most the limit's
// connections to the database are open at once (a legacy database that
// takes max_connections in all). Connect waits for a slot within its context; the
// lease is released when the connection closes; a connection whose lease
// was lost closes at once if idle, else answers driver.ErrBadConn on its
// next use, so database/sql discards it and opens another.
//
// Idle connections give their slots back to a Connect that waits: its own
// connector's at once, and, when sem is a *fair.Semaphore or
// *unfair.Semaphore (a family member too), those of every connector of the
// same semaphore in any process, through a pub/sub channel of the
// semaphore (the connector subscribes at its first Connect, on sem's Redis
// client); one connector answers each waiting Connect. When the connector
// that answers has no idle connection, the next of its connections whose
// query ends goes back instead of serving the next query, so that slots
// rotate among processes. To another process a connection gives its slot
// back only once it has held it Options.MinHold, so that busy processes
// take turns in slices, not one query each. A connection that gives its
// slot back is closed; the pool opens another when it needs one. Nothing
// is sent to Redis while no Connect waits.
//
// Use it with sql.OpenDB. The returned connector also implements io.Closer
// (sql.DB.Close calls it: it ends the subscription and closes base if it is
// an io.Closer; sem stays open, it is the caller's) and Driver (a
// driver.Driver whose Open also holds a lease). It is
// NewConnectorOptions with the zero Options.
func NewConnector(base driver.Connector, sem redsem.Semaphore) driver.Connector {
	return NewConnectorOptions(base, sem, Options{})
}

// NewConnectorOptions is NewConnector with options. Invalid options (a
// MinHold not shorter than a bounded ConnectTimeout) or a nil sem make
// every Connect and Driver().Open return a *redsem.ConfigError (matching
// redsem.ErrInvalidConfig) at once, opening nothing: database/sql reports
// it on the first query (or db.Ping).
func NewConnectorOptions(base driver.Connector, sem redsem.Semaphore, opts Options) driver.Connector {
	slots, err := connslots.New(sem, "redsemsql", connslots.Options{ConnectTimeout: opts.ConnectTimeout, MinHold: opts.MinHold})
	return &connector{base: base, slots: slots, err: err}
}

type connector struct {
	base  driver.Connector
	slots *connslots.Pool // nil when err is set
	err   error           // invalid options: every Connect returns it
}

var (
	_ driver.Connector = (*connector)(nil)
	_ io.Closer        = (*connector)(nil)
)

// Connect waits for a lease within ctx (and Options.ConnectTimeout if ctx
// has no deadline), then
// opens a connection with the base connector. If no lease is granted it
// returns an error prefixed "redsemsql: " that wraps the cause
// (errors.Is(err, ctx.Err()) when ctx ended, ErrConnectTimeout when the
// bound passed) and opens nothing. If the base Connect fails, the lease is
// released and its error returned unchanged.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	return c.open(ctx, func() (driver.Conn, error) { return c.base.Connect(ctx) })
}

// Driver returns a driver whose Open holds a lease as Connect does
// (waiting up to Options.ConnectTimeout).
func (c *connector) Driver() driver.Driver { return &leasedDriver{base: c.base.Driver(), c: c} }

// Close ends the connector's demand subscription and closes the base
// connector if it implements io.Closer (sql.DB.Close calls it); it does not
// close the semaphore.
func (c *connector) Close() error {
	if c.slots != nil {
		c.slots.Close()
	}
	if cl, ok := c.base.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

type leasedDriver struct {
	base driver.Driver
	c    *connector
}

// Open waits for a lease, then opens a connection with the base driver.
func (d *leasedDriver) Open(name string) (driver.Conn, error) {
	return d.c.open(context.Background(), func() (driver.Conn, error) { return d.base.Open(name) })
}

// open acquires a lease, then connects; the lease goes with the connection.
func (c *connector) open(ctx context.Context, connect func() (driver.Conn, error)) (driver.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	slot, err := c.slots.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	base, err := connect()
	if err != nil {
		slot.Closed()
		return nil, err
	}
	slot.Attach(base.Close)
	if fromOpener() {
		slot.Idle()
	}
	return &conn{base: base, slot: slot}, nil
}

// fromOpener reports whether database/sql's opener goroutine called
// Connect. It puts the connection into its pool at once, or hands it to a
// query that waits (whose first call marks it in use), with no call that
// would mark it idle: marked idle here, it may give its slot back, where
// otherwise it would hold it, unused, while this pool's queries wait in
// Connect. (A query that needs a new connection calls Connect itself and
// uses the connection at once.)
func fromOpener() bool {
	var pcs [16]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == "database/sql.(*DB).openNewConnection" {
			return true
		}
		if !more {
			return false
		}
	}
}

// conn is a connection that holds a slot. It implements every optional
// interface that database/sql looks for; where the base connection lacks
// one, it answers as database/sql would without it (driver.ErrSkip for the
// fast paths, nil from Ping and ResetSession, true from IsValid). Every use
// marks it in use (database/sql takes it from the pool: ResetSession, or
// any call, a prepared statement's included); IsValid, called when it
// returns to the pool, marks it idle.
type conn struct {
	base driver.Conn
	slot *connslots.Slot
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

// use marks the connection in use; driver.ErrBadConn if it was given back
// or its lease was lost (then database/sql discards it and, before
// anything was sent, retries on another).
func (c *conn) use() error {
	if !c.slot.Use() {
		return driver.ErrBadConn
	}
	return nil
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	return c.stmt(c.base.Prepare(query))
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	if p, ok := c.base.(driver.ConnPrepareContext); ok {
		return c.stmt(p.PrepareContext(ctx, query))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.stmt(c.base.Prepare(query))
}

func (c *conn) stmt(s driver.Stmt, err error) (driver.Stmt, error) {
	if err != nil {
		return nil, err
	}
	return &stmt{base: s, c: c}, nil
}

// Close closes the base connection, then releases the lease (also when
// Close fails: database/sql forgets the connection either way). A
// connection given back was closed and released already.
func (c *conn) Close() error {
	var err error
	_ = c.slot.Locked(func(gone bool) error {
		if !gone {
			err = c.base.Close()
		}
		return nil
	})
	c.slot.Closed()
	return err
}

func (c *conn) Begin() (driver.Tx, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	return c.base.Begin()
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.use(); err != nil {
		return nil, err
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
	if err := c.use(); err != nil {
		return nil, err
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
	if err := c.use(); err != nil {
		return nil, err
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
	if err := c.use(); err != nil {
		return err
	}
	if p, ok := c.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession is called by database/sql before a pooled connection is
// reused: it answers driver.ErrBadConn once the lease is lost.
func (c *conn) ResetSession(ctx context.Context) error {
	if err := c.use(); err != nil {
		return err
	}
	if r, ok := c.base.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid is called by database/sql when a connection returns to the pool:
// false once the lease is lost, so the connection is closed, and false too
// when another process waits for a slot that this connector claimed to
// give back and the connection has held its slot Options.MinHold (it goes
// back instead of serving this pool's next query); true marks the
// connection idle, so that it may give its slot back to a Connect that
// waits.
func (c *conn) IsValid() bool {
	valid := true
	if v, ok := c.base.(driver.Validator); ok {
		valid = v.IsValid()
	}
	return c.slot.Returned(valid)
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip // database/sql's default conversion
}

// stmt is a statement prepared on a conn. Running it marks the connection
// in use: database/sql may run it on a connection taken from the pool
// without calling ResetSession (when the connection came back through
// putConn without needing a reset). database/sql may close it while its
// connection is idle, so Close is ordered against giving the connection
// back (whose close ends its statements).
type stmt struct {
	base driver.Stmt
	c    *conn
}

var (
	_ driver.Stmt              = (*stmt)(nil)
	_ driver.StmtExecContext   = (*stmt)(nil)
	_ driver.StmtQueryContext  = (*stmt)(nil)
	_ driver.NamedValueChecker = (*stmt)(nil)
)

func (s *stmt) Close() error {
	return s.c.slot.Locked(func(gone bool) error {
		if gone {
			return nil
		}
		return s.base.Close()
	})
}

func (s *stmt) NumInput() int { return s.base.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	if err := s.c.use(); err != nil {
		return nil, err
	}
	return s.base.Exec(args) //nolint:staticcheck // the pre-context interface, for drivers without StmtExecContext
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	if err := s.c.use(); err != nil {
		return nil, err
	}
	return s.base.Query(args) //nolint:staticcheck // as Exec
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.c.use(); err != nil {
		return nil, err
	}
	if e, ok := s.base.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	vals, err := values(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.base.Exec(vals) //nolint:staticcheck // as Exec
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.c.use(); err != nil {
		return nil, err
	}
	if q, ok := s.base.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	vals, err := values(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.base.Query(vals) //nolint:staticcheck // as Exec
}

// CheckNamedValue is the statement's checker, else its connection's, as
// database/sql would pick for the unwrapped statement.
func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := s.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return s.c.CheckNamedValue(nv)
}
