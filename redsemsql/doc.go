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
// connection), and the lease is released when the connection closes. A
// connection whose lease was lost (Redis lost it, the process paused past
// the lease TTL) answers driver.ErrBadConn on its next use, before sending
// anything, and reports itself invalid when returned to the pool, so
// database/sql discards it and opens another, under a new lease. A
// transaction or *sql.Conn that is using the connection when its lease is
// lost sees driver.ErrBadConn on its next statement.
//
// # Idle connections
//
// An idle connection in database/sql's pool holds its slot, so that the
// next query of its process runs at once, without a round trip to Redis or
// a new connection. But database/sql never hands an idle connection to a
// query that is already waiting in Connect, and another process's pool
// cannot use it at all. So an idle connection gives its slot back, by
// closing, when a Connect waits for one:
//
//   - A Connect that has waited 10 ms for a slot closes an idle connection
//     of its own connector (idle for at least 5 ms, the longest idle first)
//     and asks again every 100 ms while it waits.
//   - When its connector has none, it publishes one demand notice on the
//     semaphore's channel ({name}:want, in the semaphore's hash tag); each
//     other connector of the semaphore, in any process, closes one of its
//     idle connections for it. This needs sem to be a *fair.Semaphore or
//     *unfair.Semaphore (a family member too): the connector subscribes on
//     sem's Redis client at its first Connect, one pub/sub connection per
//     connector, until sql.DB.Close. A wrapper with a method
//     Unwrap() redsem.Semaphore (redsemotel.Wrap's) is seen through; with a
//     semaphore of another type, only the connector's own idle connections
//     are given back.
//
// A connection in use (a query, a transaction, an *sql.Conn) is never given
// back. Nothing is sent while no Connect waits: the fast path of a query
// is untouched. database/sql learns that a given-back connection is gone
// when it next takes it from the pool (ResetSession answers
// driver.ErrBadConn, and it retries on another connection), so until then
// sql.DB.Stats counts it as idle.
//
// # Pool settings
//
//   - SetMaxOpenConns at most the limit in every process. A higher value
//     does no harm to others: the extra Connect calls wait for a slot,
//     holding nothing, and take one from idle connections of any process.
//   - SetMaxIdleConns and SetConnMaxIdleTime as for any pool: idle
//     connections no longer keep other processes waiting, but each one
//     given back costs a new connection later. database/sql closes expired
//     idle connections at most once a second.
//
// The lease is released when the driver's Close returns. The database may
// count the closed connection for a moment longer (a PostgreSQL backend
// exits after it reads the terminate message), so keep the limit a little
// below a hard server-side maximum such as max_connections.
//
// Statements prepared on a connection run on it without a lease check
// until the connection is next returned to the pool; database/sql then
// discards it if its lease was lost.
package redsemsql
