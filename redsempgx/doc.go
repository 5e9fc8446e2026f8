// Package redsempgx bounds the connections that a pgxpool opens, across
// every process, with a redsem.Semaphore: the PostgreSQL server that takes
// 20 connections in all, however many instances of the service run.
//
//	sem, _ := fair.New(client, "orders-db", 20, fair.Options{})
//	cfg, _ := pgxpool.ParseConfig("postgres://app@orders-db:5432/orders")
//	cfg.MaxConns = 5
//	pool, err := redsempgx.NewPool(ctx, cfg, sem, redsempgx.Options{})
//	defer pool.Close()
//
// Each open connection holds one lease, from the dial (the pool's
// ConnConfig.DialFunc is wrapped: it waits for a slot, then dials) until
// its socket closes. The dial waits within its context and at most
// Options.ConnectTimeout (default 10 s: pgxpool may dial in the background,
// for MinConns or for an acquire that gave up, where no caller's context
// ends the wait), then fails with an error that wraps ErrConnectTimeout.
// A connection whose lease was lost is destroyed when it is next acquired
// from the pool or released to it (queries on a connection already
// acquired are not checked).
//
// # Giving slots back
//
// The give-back protocol is redsemsql's, shared with it: a dial that finds
// every slot taken (one TryAcquire) and has waited 10 ms for a slot closes an idle connection of its own pool (idle
// at least 5 ms, the longest idle first) and asks again every 100 ms; when
// its pool has none, it publishes a demand notice on the semaphore's
// channel ({name}:want), and the one pool of the semaphore, in any process,
// that claims it first (SET NX on {name}:want:claim:..., in the same hash
// tag) gives one slot back: an idle connection at once (its socket is
// closed; the pool destroys it when it next acquires it, after a failed
// ping or through PrepareConn, and retries on another), or, if it has none
// idle, the next of its connections to be released (AfterRelease answers
// false: pgxpool destroys it). So with a *fair.Semaphore slots rotate
// among busy processes in the order they asked, and a process that starts
// while another runs a long burst gets its first query within about one
// query's time. Cross-process give-back needs sem to be a *fair.Semaphore
// or *unfair.Semaphore (a family member too, or a wrapper with
// Unwrap() redsem.Semaphore); the pool subscribes on sem's Redis client at
// its first dial, until Close. Nothing is sent to Redis while no dial
// waits. A connection acquired (between Acquire and Release) is never
// given back.
//
// NewPool installs its hooks beside yours: it wraps the config's
// DialFunc, AfterConnect, PrepareConn (or BeforeAcquire), AfterRelease and
// BeforeClose, calling yours too. A new connection counts as idle from
// 100 ms after it opened until an acquire takes it (every acquire goes
// through PrepareConn, which marks it in use), so that one the pool opens
// in the background (MinConns) does not hold its slot unused while others
// wait.
//
// # Pool settings
//
//   - MaxConns: at most the limit in every process; to share the limit
//     evenly under load, about the limit divided by the number of
//     processes busy at once. A higher value does no harm to others: the
//     extra dials wait for a slot, holding nothing.
//   - MinConns: 0, or what a process needs between bursts (its idle
//     connections give their slots back when anyone waits). MaxConnIdleTime
//     as for any pool.
//   - sslmode=prefer (pgx's default) may dial twice, once for TLS and once
//     without, each waiting for a slot: say require or disable.
//
// The lease is released when the socket closes; PostgreSQL may count the
// backend for a moment longer, so keep the limit a little below a hard
// server-side maximum such as max_connections.
//
// Each give-back costs a new connection later (TCP and TLS handshakes,
// authentication, a new backend process). Where processes contend all the
// time, a connection proxy (pgbouncer, RDS Proxy, PgCat) that multiplexes
// client connections onto a few server connections is the better tool: it
// shares server connections per transaction without closing them. This
// package fits a hard limit across processes that do not contend all the
// time, or a server that no proxy fronts.
package redsempgx
