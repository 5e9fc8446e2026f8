// Package redsemsql bounds the connections that database/sql opens, across
// every process, with a redsem.Semaphore: the legacy database that takes 20
// connections in all, however many instances of the service run.
//
//	sem, _ := unfair.New(client, "legacy-db", 20, unfair.Options{})
//	db := sql.OpenDB(redsemsql.NewConnector(baseConnector, sem))
//	db.SetMaxOpenConns(5)
//
// Each open connection holds one lease. Connect waits for a slot within its
// context (database/sql passes the context of the query that needs the
// connection), and the lease is released when the connection closes
// (without holding up the closer: a release that Redis does not answer at
// once goes on in the background, the slot back then or at the lease's
// deadline). A
// connection whose lease was lost (Redis lost it, the process paused past
// the lease TTL) answers driver.ErrBadConn on its next use, before sending
// anything, and reports itself invalid when returned to the pool, so
// database/sql discards it and opens another, under a new lease. An idle
// one closes as soon as the loss is found (at the lease's next renewal),
// so that the database no longer counts it beside the new holder's. A
// transaction or *sql.Conn that is using the connection when its lease is
// lost sees driver.ErrBadConn on its next statement (a statement prepared
// on a *sql.Conn sees sql.ErrConnDone: database/sql closes the *sql.Conn
// on the driver's ErrBadConn and runs the statement again on it); nothing
// reaches the database either way.
//
// For pgx's own pool (pgxpool), use package redsempgx: the same slots and
// the same give-back protocol, shared across processes with this package's
// connectors of the same semaphore.
//
// # Giving slots back
//
// An idle connection in database/sql's pool holds its slot, so that the
// next query of its process runs at once, without a round trip to Redis or
// a new connection. But database/sql never hands an idle connection to a
// query that is already waiting in Connect, and another process's pool
// cannot use it at all; and a busy pool's connections are never idle. So
// a connection gives its slot back, by closing, when a Connect waits:
//
//   - A Connect that finds every slot taken (one TryAcquire) and has
//     waited 10 ms for a slot closes an idle connection of its own
//     connector (idle for at least 5 ms, the longest idle first) and asks
//     again every 100 ms while it waits.
//   - When its connector has none, it publishes a demand notice on the
//     semaphore's channel ({name}:want, in the semaphore's hash tag), and
//     again every 100 ms. One other connector of the semaphore, in any
//     process, answers the waiting Connect: the first to claim it (SET NX
//     on {name}:want:claim:..., in the same hash tag; a connector with an
//     idle connection it may give back claims at once, one without waits
//     10 ms first, and until its oldest connection has held its slot
//     Options.MinHold). It closes its idle connection the longest idle,
//     or, if it has none, the next of its connections to return to its
//     pool goes back instead of serving the pool's next query
//     (database/sql calls IsValid on the way back: it answers false).
//   - Time slices: a connection gives its slot back to another process
//     only once it has held it Options.MinHold (default 500 ms, from the
//     grant); one returning before then serves its pool's next query. So
//     busy processes take turns: a rotation costs one new connection per
//     slice, not one per query, and with a *fair.Semaphore a process that
//     starts while another runs a long burst gets its first query within
//     about MinHold plus a connect, in the order processes asked, not
//     after the burst. A Connect's own connector closes an idle connection
//     for it at once, whatever its age. A negative MinHold gives back at
//     once, as before MinHold existed (a new connection every few queries
//     when busy processes share the limit).
//   - This needs sem to be a *fair.Semaphore or *unfair.Semaphore (a
//     family member too): the connector subscribes on sem's Redis client
//     at its first Connect, one pub/sub connection per connector, until
//     sql.DB.Close. A wrapper with a method Unwrap() redsem.Semaphore
//     (redsemotel.Wrap's) is seen through; with a semaphore of another
//     type, only the connector's own idle connections are given back.
//
// A connection in use (a query, a transaction, an *sql.Conn, a prepared
// statement running) is never closed under it. One exception: a
// connection that database/sql's opener goroutine opened counts as idle
// from 100 ms after it opened until its first call, since database/sql may
// put it straight into its pool; an *sql.Conn (sql.DB.Conn) that waited
// for a connection and got such a one, then held it that long without a
// call while another Connect of its connector waited (or MinHold while
// one of another process did), sees driver.ErrBadConn on its first
// statement. Nothing is sent while no Connect waits: the fast path of a
// query is untouched. database/sql
// learns that a given-back idle connection is gone when it next takes it
// from the pool (ResetSession, or the first statement, answers
// driver.ErrBadConn, and it retries on another connection), so until then
// sql.DB.Stats counts it as idle. With an *unfair.Semaphore a slot given
// back goes to whichever process asks first (the giving process's own
// next Connect included), so rotation is likely but not ordered.
//
// Each give-back costs a new connection later (a TCP and TLS handshake and
// authentication, and a new backend process for PostgreSQL): once a slice
// per slot when busy processes share the limit. BenchmarkShare
// (share_test.go, against PostgreSQL through pgx's stdlib; one machine with
// 2 cores, PostgreSQL and Redis on it; limit 3, SetMaxOpenConns(3) and
// SetMaxIdleConns(3), 6 workers per pool each running a 2 ms query back to
// back; -benchtime 3000x): two pools (two Redis clients and semaphores, as
// two processes) ran 1293 queries a second together against 1296 for one
// pool alone, 1.00x (0.97-1.00x over three runs), with 5 new connections
// per 1000 queries and the less served pool at 0.97 of an even share; with
// MinHold -1, 1063 a second, 0.82x, 66 new connections per 1000 queries;
// the code before MinHold, run right after: 1011 against 1318 alone,
// 0.77x, 70 per 1000. Where processes contend all the time and cannot
// wait a slice, a connection proxy (pgbouncer, RDS Proxy, PgCat) that
// multiplexes many client connections onto a few server connections is
// the better tool: it shares server connections per transaction without
// closing them. This package fits a hard limit across
// processes that do not contend all the time, or a database that no proxy
// fronts.
//
// # Connect's bound
//
// database/sql's opener goroutine calls Connect with a context that never
// ends (sql.DB's own, until Close), and so does Driver().Open. A Connect
// whose context has no deadline waits for a slot at most
// Options.ConnectTimeout (default 10 s), then fails with an error that
// wraps ErrConnectTimeout
// (database/sql passes it to a query waiting for a connection), so that a
// blocked opener does not hold one of MaxOpenConns forever.
//
// # Pool settings
//
//   - SetMaxOpenConns: at most the limit in every process. At the limit,
//     busy processes take turns (see Time slices above): together they
//     run about as many queries as one process alone, and each waits up
//     to about MinHold plus a connect for its turn. At about the limit
//     divided by the number of processes busy at once, each keeps its
//     share without waiting for turns. Connect calls beyond the slots free
//     wait for one, holding none; with a *fair.Semaphore turns go in the
//     order Connects queued, so a process with more of them waiting (a
//     higher SetMaxOpenConns) gets more turns.
//   - SetMaxIdleConns: what a process needs between bursts (its idle
//     connections give their slots back when anyone waits, once they have
//     held them MinHold, so they keep others waiting a slice at most);
//     database/sql's default, 2, is a good
//     start. SetConnMaxIdleTime as for any pool (database/sql closes
//     expired idle connections at most once a second).
//
// The lease is released when the driver's Close returns. The database may
// count the closed connection for a moment longer (a PostgreSQL backend
// exits after it reads the terminate message), so keep the limit a little
// below a hard server-side maximum such as max_connections.
//
// A statement prepared on a connection checks the connection's lease each
// time it runs, as the connection's own calls do.
package redsemsql
