package redsempgx

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/connslots"
)

// ErrConnectTimeout is wrapped by the error of a dial that got no slot
// within Options.ConnectTimeout (its context still running).
var ErrConnectTimeout = connslots.ErrConnectTimeout

// Options tune a pool. The zero value is valid.
type Options struct {
	// ConnectTimeout bounds a dial's wait for a slot, whatever its
	// context: pgxpool dials in the background too (MinConns, and an
	// acquire that gave up while its connection was being made), with no
	// caller's context to end the wait. Then the dial fails with an error
	// that wraps ErrConnectTimeout. Default 10 s; negative: only the
	// context bounds the wait.
	ConnectTimeout time.Duration
	// MinHold: a connection keeps its slot at least this long (from its
	// grant) before it gives it back to a waiting process; 0: the default
	// (500 ms); negative: give back at once (the behaviour before MinHold
	// existed, which costs a new connection per query when busy processes
	// share the limit). A waiting process is served within about MinHold
	// plus a connect. It must be shorter than a bounded ConnectTimeout
	// (NewPool returns a *redsem.ConfigError otherwise).
	MinHold time.Duration
}

// Pool is a pgxpool.Pool whose connections each hold a lease of a
// semaphore. Use it as the pgxpool.Pool it embeds; Close closes it.
type Pool struct {
	*pgxpool.Pool
	slots *connslots.Pool

	mu    sync.Mutex
	conns map[*pgx.Conn]*connslots.Slot
}

// NewPool creates a pgxpool.Pool from cfg (as pgxpool.NewWithConfig) whose
// connections each hold a lease of sem: across every process, at most the
// limit's connections to the server are open at once. A dial waits for a
// slot within its context and Options.ConnectTimeout; the lease is
// released when the connection's socket closes. Connections give their
// slots back to a dial that waits, in any process (see the package doc).
//
// It sets cfg's DialFunc, AfterConnect, PrepareConn, AfterRelease and
// BeforeClose, calling those cfg had (BeforeAcquire as pgxpool would, when
// PrepareConn is nil); cfg must not be used for another pool. On failure
// it returns pgxpool's error and holds nothing. sem stays open: it is the
// caller's. Invalid options (a MinHold not shorter than a bounded
// ConnectTimeout) or a nil sem give a *redsem.ConfigError (matching
// redsem.ErrInvalidConfig), before cfg is touched.
func NewPool(ctx context.Context, cfg *pgxpool.Config, sem redsem.Semaphore, opts Options) (*Pool, error) {
	slots, err := connslots.New(sem, "redsempgx", connslots.Options{ConnectTimeout: opts.ConnectTimeout,
		BoundAll: true, MinHold: opts.MinHold})
	if err != nil {
		return nil, err
	}
	p := &Pool{slots: slots, conns: map[*pgx.Conn]*connslots.Slot{}}
	p.hook(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		p.slots.Close()
		return nil, err
	}
	p.Pool = pool
	return p, nil
}

// Close closes the pool (as pgxpool.Pool.Close: it waits for acquired
// connections to be released), then ends its demand subscription.
func (p *Pool) Close() {
	p.Pool.Close()
	p.slots.Close()
}

// hook installs the pool's hooks in cfg, around cfg's own.
func (p *Pool) hook(cfg *pgxpool.Config) {
	dial := cfg.ConnConfig.DialFunc
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		slot, err := p.slots.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		nc, err := dial(ctx, network, addr)
		if err != nil {
			slot.Closed()
			return nil, err
		}
		slot.Attach(nc.Close)
		return &slotConn{Conn: nc, slot: slot}, nil
	}

	afterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, c); err != nil {
				return err
			}
		}
		slot := slotOf(c)
		if slot == nil {
			return errors.New("redsempgx: the connection's socket is not the one dialled with a slot (a DialFunc set after NewPool?)")
		}
		p.mu.Lock()
		p.conns[c] = slot
		p.mu.Unlock()
		// Every acquire calls PrepareConn, which marks it in use; until
		// then it is on its way to an acquirer (which takes it within
		// Idle's grace) or sits in the pool (MinConns), and may give its
		// slot back.
		slot.Idle()
		return nil
	}

	prepare := cfg.PrepareConn
	if prepare == nil && cfg.BeforeAcquire != nil {
		before := cfg.BeforeAcquire
		prepare = func(ctx context.Context, c *pgx.Conn) (bool, error) { return before(ctx, c), nil }
	}
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if slot := p.slot(c); slot != nil && !slot.Use() {
			return false, nil // given back or lease lost: pgxpool destroys it and retries
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}

	afterRelease := cfg.AfterRelease
	cfg.AfterRelease = func(c *pgx.Conn) bool {
		valid := afterRelease == nil || afterRelease(c)
		if slot := p.slot(c); slot != nil {
			return slot.Returned(valid)
		}
		return valid
	}

	beforeClose := cfg.BeforeClose
	cfg.BeforeClose = func(c *pgx.Conn) {
		if beforeClose != nil {
			beforeClose(c)
		}
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}
}

func (p *Pool) slot(c *pgx.Conn) *connslots.Slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[c]
}

// slotOf finds the slot of a connection by its socket (under TLS, the
// socket under the tls.Conn).
func slotOf(c *pgx.Conn) *connslots.Slot {
	nc := c.PgConn().Conn()
	for range 4 {
		if sc, ok := nc.(*slotConn); ok {
			return sc.slot
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		nc = u.NetConn()
	}
	return nil
}

// slotConn is a connection's socket, which holds its slot until it closes.
// A give-back closes the socket under the slot's lock, from another
// goroutine than pgx's (net.Conn's Close may be called so): pgx then sees
// it closed.
type slotConn struct {
	net.Conn
	slot *connslots.Slot
}

// Close closes the socket, unless it was given back (closed then), and
// releases the slot.
func (c *slotConn) Close() error {
	err := c.slot.Locked(func(gone bool) error {
		if gone {
			return nil
		}
		return c.Conn.Close()
	})
	c.slot.Closed()
	return err
}
