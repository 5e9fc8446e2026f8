package redsemsql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/detach"
)

// releaseTimeout bounds the Release made when a connection closes.
const releaseTimeout = 5 * time.Second

// closeWait bounds how long Close waits for the demand subscription to end.
const closeWait = 100 * time.Millisecond

// Demand: a Connect that has waited demandAfter for a slot asks idle
// connections to give one back, and asks again every demandEvery while it
// waits: first its own connector's (at once, in memory), else every
// connector of the semaphore, in any process (one PUBLISH on the
// semaphore's demand channel). A connection idle for less than minIdle is
// passing from one query to the next and is left alone.
const (
	demandAfter = 10 * time.Millisecond
	demandEvery = 100 * time.Millisecond
	minIdle     = 5 * time.Millisecond
)

// NewConnector wraps a database/sql connector so that each open connection
// holds a lease of sem: across every process, at most the limit's
// connections to the database are open at once (the seed's legacy database
// with max_connections). Connect waits for a slot within its context; the
// lease is released when the connection closes; a connection whose lease
// was lost answers driver.ErrBadConn on its next use, so database/sql
// discards it and opens another.
//
// Idle connections give their slots back to a Connect that waits: its own
// connector's at once, and, when sem is a *fair.Semaphore or
// *unfair.Semaphore (a family member too), those of every connector of the
// same semaphore in any process, through a pub/sub channel of the
// semaphore (the connector subscribes at its first Connect, on sem's Redis
// client). An idle connection that gives its slot back is closed; the pool
// opens another when it needs one. Nothing is sent to Redis while no
// Connect waits.
//
// Use it with sql.OpenDB. The returned connector also implements io.Closer
// (sql.DB.Close calls it: it ends the subscription and closes base if it is
// an io.Closer; sem stays open, it is the caller's) and Driver (a
// driver.Driver whose Open also holds a lease).
func NewConnector(base driver.Connector, sem redsem.Semaphore) driver.Connector {
	return &connector{base: base, sem: sem, eng: core.EngineOf(sem), id: uuid.NewString(), conns: map[*conn]struct{}{}}
}

type connector struct {
	base driver.Connector
	sem  redsem.Semaphore
	eng  *core.Engine // nil: sem is not ours; demand stays in this connector
	id   string       // on demand notices, so that a connector ignores its own

	mu        sync.Mutex
	conns     map[*conn]struct{} // open, not given back
	listening bool
	closed    bool
	stop      context.CancelFunc // ends the subscription
	stopped   chan struct{}      // closed when the subscription ended
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
	return c.open(ctx, func() (driver.Conn, error) { return c.base.Connect(ctx) })
}

// Driver returns a driver whose Open holds a lease as Connect does
// (waiting without a deadline), for code that calls sql.DB.Driver().Open.
func (c *connector) Driver() driver.Driver { return &leasedDriver{base: c.base.Driver(), c: c} }

// Close ends the connector's demand subscription and closes the base
// connector if it implements io.Closer (sql.DB.Close calls it); it does not
// close the semaphore.
func (c *connector) Close() error {
	c.mu.Lock()
	c.closed = true
	stop, stopped := c.stop, c.stopped
	c.mu.Unlock()
	if stop != nil {
		stop()
		// The subscription ends at once, unless its first dial to an
		// unreachable Redis is in flight: that ends on its own.
		select {
		case <-stopped:
		case <-time.After(closeWait):
		}
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
	c.listen()
	lease, err := c.acquire(ctx)
	if err != nil {
		open, idle := c.count()
		return nil, fmt.Errorf("redsemsql: no connection slot (this pool: %d open, %d idle): %w", open, idle, err)
	}
	base, err := connect()
	if err != nil {
		release(ctx, lease)
		return nil, err
	}
	cn := &conn{base: base, lease: lease, owner: c}
	c.mu.Lock()
	c.conns[cn] = struct{}{}
	c.mu.Unlock()
	return cn, nil
}

// acquire is sem.Acquire that asks idle connections for a slot while it
// waits (see demandAfter).
func (c *connector) acquire(ctx context.Context) (redsem.Lease, error) {
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(demandAfter)
		defer t.Stop()
		for {
			select {
			case <-dctx.Done():
				return
			case <-t.C:
			}
			c.demand(dctx)
			t.Reset(demandEvery)
		}
	}()
	lease, err := c.sem.Acquire(ctx)
	cancel()
	<-done
	return lease, err
}

// demand gives back one of this connector's idle slots, or, if it has
// none, asks every connector of the semaphore to.
func (c *connector) demand(ctx context.Context) {
	if c.reclaim() || c.eng == nil {
		return
	}
	_ = c.eng.PublishDemand(ctx, c.id) // Redis down: Acquire reports it
}

// listen subscribes to the semaphore's demand notices, once.
func (c *connector) listen() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.eng == nil || c.listening || c.closed {
		return
	}
	c.listening = true
	ctx, cancel := context.WithCancel(context.Background())
	c.stop, c.stopped = cancel, make(chan struct{})
	go c.serve(ctx)
}

// serve gives back an idle slot for each demand notice of another
// connector, until Close.
func (c *connector) serve(ctx context.Context) {
	defer close(c.stopped)
	ps := c.eng.SubscribeDemand(ctx)
	defer func() { _ = ps.Close() }()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if m.Payload != c.id {
				c.reclaim()
			}
		}
	}
}

// reclaim closes the connection idle the longest (at least minIdle) and
// releases its lease; false if there is none.
func (c *connector) reclaim() bool {
	now := time.Now()
	for {
		var best *conn
		var since time.Time
		c.mu.Lock()
		for cn := range c.conns {
			if t, ok := cn.idleSince(); ok && now.Sub(t) >= minIdle && (best == nil || t.Before(since)) {
				best, since = cn, t
			}
		}
		c.mu.Unlock()
		if best == nil {
			return false
		}
		if best.giveBack() {
			return true
		}
		// taken meanwhile: look again
	}
}

// count returns how many of the connector's connections are open and idle.
func (c *connector) count() (open, idle int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cn := range c.conns {
		open++
		if _, ok := cn.idleSince(); ok {
			idle++
		}
	}
	return open, idle
}

func (c *connector) forget(cn *conn) {
	c.mu.Lock()
	delete(c.conns, cn)
	c.mu.Unlock()
}

func release(ctx context.Context, l redsem.Lease) {
	_ = detach.Release(ctx, l, releaseTimeout) // on failure the slot comes back after the lease TTL
}

// A connection is in use (from its Connect, and from each time database/sql
// takes it from the pool: ResetSession or any call), idle (from when it was
// returned to the pool: IsValid), given back (closed and its lease released
// while idle, for a waiting Connect) or closed.
type state uint8

const (
	inUse state = iota
	idle
	givenBack
	closed
)

// conn is a connection that holds a lease. It implements every optional
// interface that database/sql looks for; where the base connection lacks
// one, it answers as database/sql would without it (driver.ErrSkip for the
// fast paths, nil from Ping and ResetSession, true from IsValid).
type conn struct {
	base  driver.Conn
	lease redsem.Lease
	owner *connector
	once  sync.Once // releases the lease

	// mu orders giving back against every use of base: base is closed
	// under mu, and a use that finds the connection given back answers
	// driver.ErrBadConn without touching base.
	mu    sync.Mutex
	st    state
	since time.Time // idle since
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st == givenBack || c.st == closed {
		return driver.ErrBadConn
	}
	c.st = inUse
	if c.lease.Err() != nil {
		return driver.ErrBadConn
	}
	return nil
}

// idleSince reports when the connection went idle, if it is.
func (c *conn) idleSince() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.since, c.st == idle
}

// giveBack closes an idle connection and releases its lease; false if it
// is no longer idle.
func (c *conn) giveBack() bool {
	c.mu.Lock()
	if c.st != idle {
		c.mu.Unlock()
		return false
	}
	c.st = givenBack
	_ = c.base.Close()
	c.mu.Unlock()
	c.owner.forget(c)
	c.once.Do(func() { release(context.Background(), c.lease) })
	return true
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
	c.mu.Lock()
	st := c.st
	c.st = closed
	var err error
	if st != givenBack && st != closed {
		err = c.base.Close()
	}
	c.mu.Unlock()
	c.owner.forget(c)
	c.once.Do(func() { release(context.Background(), c.lease) })
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
// false once the lease is lost, so the connection is closed; true marks
// the connection idle, so that it may give its slot back to a Connect
// that waits.
func (c *conn) IsValid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st == givenBack || c.st == closed || c.lease.Err() != nil {
		return false
	}
	if v, ok := c.base.(driver.Validator); ok && !v.IsValid() {
		return false
	}
	c.st, c.since = idle, time.Now()
	return true
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.base.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip // database/sql's default conversion
}

// stmt is a statement prepared on a conn. database/sql may close it while
// its connection is idle, so Close is ordered against giving the
// connection back (whose close ends its statements).
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
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.st == givenBack {
		return nil
	}
	return s.base.Close()
}

func (s *stmt) NumInput() int { return s.base.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.base.Exec(args) //nolint:staticcheck // the pre-context interface, for drivers without StmtExecContext
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.base.Query(args) //nolint:staticcheck // as Exec
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
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
