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
// A connection whose lease was lost closes its socket at once if it is
// idle (pgxpool destroys it when it next acquires it), else it is
// destroyed when released to the pool (queries on a connection already
// acquired are not checked).
//
// # Giving slots back
//
// The give-back protocol is redsemsql's, shared with it: a dial that finds
// every slot taken (one TryAcquire) and has waited 10 ms for a slot closes
// an idle connection of its own pool (idle at least 5 ms, the longest idle
// first) and asks again every 100 ms; when its pool has none, it publishes
// a demand notice on the semaphore's channel ({name}:want), and the one
// pool of the semaphore, in any process, that claims the waiting dial
// first (SET NX on {name}:want:claim:..., in the same hash tag) gives one
// slot back: an idle connection at once (its socket is closed; the pool
// destroys it when it next acquires it, after a failed ping or through
// PrepareConn, and retries on another), or, if it has none idle, the next
// of its connections to be released (AfterRelease answers false: pgxpool
// destroys it). One pool answers a waiting dial at a time, however often
// it asks. Cross-process give-back needs sem to be a *fair.Semaphore or
// *unfair.Semaphore (a family member too, or a wrapper with
// Unwrap() redsem.Semaphore); the pool subscribes on sem's Redis client at
// its first dial, until Close. Nothing is sent to Redis while no dial
// waits. A connection acquired (between Acquire and Release) is never
// given back.
//
// # Time slices
//
// A connection gives its slot back to another process only once it has
// held it Options.MinHold (default 500 ms, from the grant): a pool whose
// connections are younger claims a waiting dial only when its oldest comes
// of age, and a connection released before then serves its pool's next
// query. So busy processes take turns in slices: a rotation costs one new
// connection per slice, not one per query, and with a *fair.Semaphore a
// process that starts while another runs a long burst gets its first
// query within about MinHold plus a connect, in the order processes
// asked. A dial's own pool closes an idle connection for it at once,
// whatever its age (with a *fair.Semaphore the slot goes to the dial
// queued first, which may be another process's). A negative MinHold gives
// back at once, as before MinHold existed: busy processes then rotate a
// connection every query or two.
//
// BenchmarkShare (share_test.go; one machine with 2 cores, PostgreSQL and
// Redis on it; limit 3, MaxConns 3, 6 workers per pool each running a 2 ms
// query back to back; -benchtime 3000x): two pools (two Redis clients and
// semaphores, as two processes) ran 1164 queries a second together against
// 1338 for one pool alone, 0.87x (0.87-0.91x over five runs), with 6 new
// connections per 1000 queries and the less served pool at 0.87 of an
// even share. With MinHold -1: 936 a second, 0.70x, 131 new connections
// per 1000 queries; the code before MinHold, run right after: 918 against
// 1274 alone, 0.72x (0.54x in another run), 132 per 1000. Two processes
// of the same loop for 5 s ran 633 + 673 queries a second with 15 + 18
// dials, against 1298 for one alone (the code before MinHold: 469 + 463,
// 304 dials each).
//
// NewPool installs its hooks beside yours: it wraps the config's
// DialFunc, AfterConnect, PrepareConn (or BeforeAcquire), AfterRelease and
// BeforeClose, calling yours too. A new connection counts as idle from
// 100 ms after it opened until an acquire takes it (every acquire goes
// through PrepareConn, which marks it in use), so that one the pool opens
// in the background (MinConns) does not hold its slot unused while others
// wait (beyond MinHold).
//
// # Pool settings
//
//   - MaxConns: at most the limit in every process. At the limit, busy
//     processes take turns (see Time slices): together they run about as
//     many queries as one process alone, and each waits up to about
//     MinHold plus a connect for its turn. At about the limit divided by
//     the number of processes busy at once, each keeps its share without
//     waiting for turns. Dials beyond the slots free wait for one, holding
//     none, and so do the acquires that started them (pgxpool hands such
//     an acquire the connection it dials, not one released meanwhile);
//     with a *fair.Semaphore turns go in the order dials queued, so a
//     process with more dials waiting (a higher MaxConns) gets more turns.
//   - MinConns: 0, or what a process needs between bursts (its idle
//     connections give their slots back when anyone waits, once they have
//     held them MinHold). MaxConnIdleTime as for any pool.
//   - sslmode=prefer (pgx's default) may dial twice, once for TLS and once
//     without, each waiting for a slot: say require or disable.
//
// The lease is released when the socket closes (without holding up the
// pool for more than a moment: a release that Redis does not answer at
// once goes on in the background); PostgreSQL may count the
// backend for a moment longer, so keep the limit a little below a hard
// server-side maximum such as max_connections.
//
// Each give-back costs a new connection later (TCP and TLS handshakes,
// authentication, a new backend process): once a slice per slot when busy
// processes share the limit. Where processes contend all the time and
// cannot wait a slice, a connection proxy (pgbouncer, RDS Proxy, PgCat)
// that multiplexes client connections onto a few server connections is
// the better tool: it shares server connections per transaction without
// closing them. This
// package fits a hard limit across processes that do not contend all the
// time, or a server that no proxy fronts.
package redsempgx
