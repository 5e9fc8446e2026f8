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
// # Pool settings
//
// Idle connections in database/sql's pool hold their slots too: a process
// whose pool keeps 5 idle connections keeps 5 slots from every other
// process. So:
//
//   - Set SetMaxOpenConns to at most the limit in every process. A higher
//     value does no harm to others: the extra Connect calls wait for a
//     slot, holding nothing.
//   - Bound idle slots with SetMaxIdleConns (database/sql's default is 2) and
//     SetConnMaxIdleTime, so that a process that has gone quiet gives its
//     slots back. database/sql closes expired idle connections at most once
//     a second, so a very short idle time does not help more than that.
//   - Without such bounds, processes whose pools together hold the limit in
//     idle connections make every other process wait in Connect until its
//     context ends.
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
