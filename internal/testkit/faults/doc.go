// Package faults holds redsem's fault-injection tests and scale benchmarks;
// it has no code of its own. The tests run both variants against real
// redis-server processes that they start, restart, kill, pause and cluster
// (via internal/testkit/redistest), put an in-test TCP proxy between client and
// Redis to lose replies and black-hole connections, and kill or stop child
// processes that hold or wait. docs/reliability.md states what they show.
//
// The core set (cluster smoke test, restart, lost replies and unreachable
// Redis, kill -9 of holders and waiters) always runs; the longer tests
// (pub/sub killed, paused holder, keys deleted, eviction, out of memory,
// replicas, cluster and Sentinel failover, crash failovers that lose
// grants) are skipped with -short.
package faults
