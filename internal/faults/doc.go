// Package faults holds redsem's fault-injection tests; it has no code of its
// own. The tests run both variants against real redis-server processes that
// they start, restart, kill, pause and cluster (via internal/redistest), put
// an in-test TCP proxy between client and Redis to lose replies and black-hole
// connections, and kill or stop child processes that hold or wait.
//
// The core set (cluster smoke test, restart, lost replies and unreachable
// Redis, kill -9 of holders and waiters) runs in every `go test`; the longer
// fault tests are skipped with -short... no: they are skipped unless
// REDSEM_LONG_FAULTS=1 (see long_test.go).
package faults
