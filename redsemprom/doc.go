// Package redsemprom exports redsem semaphores' metrics to Prometheus.
//
// Two collectors, for two kinds of truth:
//
//   - Metrics turns the events of the semaphores of this process into
//     counters, histograms and a gauge: pass its Observe method as the
//     Observer in fair.Options or unfair.Options. It sees what this process
//     does (acquires by result, waits, holds, lost leases, evicted waiters,
//     leases held now) and costs no Redis command.
//   - StatusCollector reads each semaphore's Status from Redis on every
//     scrape: the global holders, the fair queue's length and the limit in
//     force, as all processes together see them. It costs one read-only
//     script call per semaphore per scrape.
//
// Metric names (with the default namespace "redsem"); every series has a
// "name" label, the semaphore's name, so keep the set of names bounded.
// A keyed family's members (fair.Family, unfair.Family) are counted under
// the family's name: give the family's options Observer: m.Observe and its
// events carry the family's name (redsem.Event.Family), which Metrics uses
// as the label; a member's key is never a label, so a family of 10 000
// tenants makes one series per metric, as redsemotel.WrapFamily's metrics
// do (sum over them there, or use redsemotel's spans, for one key):
//
//	redsem_holders{name}                      gauge: leases this process holds now (events)
//	redsem_acquire_total{name,result}         counter: result is ok, timeout, canceled, unavailable, error or mismatch
//	redsem_wait_seconds{name}                 histogram: wait of each granted acquire
//	redsem_hold_seconds{name}                 histogram: grant to Release call, or to the loss
//	redsem_leases_lost_total{name}            counter: leases that expired or were removed
//	redsem_waiters_evicted_total{name}        counter: fair waiters evicted from the queue
//	redsem_eviction_policy_unsafe{name,policy} gauge: 1 if maxmemory-policy may evict the keys
//	redsem_status_holders{name}               gauge: live holders in Redis (StatusCollector)
//	redsem_status_queue_length{name}          gauge: live fair waiters in Redis (StatusCollector)
//	redsem_status_limit{name}                 gauge: limit in force (StatusCollector)
//	redsem_status_up{name}                    gauge: 1 if the last Status read worked
//	redsem_status_owner_slots{name,owner}     gauge: slots held per Options.Owner (StatusCollector)
//	redsem_status_owner_waiters{name,owner}   gauge: live fair waiters per Options.Owner
//	redsem_status_rate_limit{name}            gauge: the rate's Limit (only with a rate)
//	redsem_status_rate_period_seconds{name}   gauge: the rate's Per (only with a rate)
//	redsem_status_rate_granted{name}          gauge: slots granted in the window ending now
//
// The results of redsem_acquire_total: ok (granted), timeout (the
// context's deadline passed), canceled (the context was cancelled: the
// caller gave up, not the semaphore), unavailable (Redis could not be
// reached, redsem.ErrUnavailable), error (any other Redis error) and
// mismatch (redsem.ErrLimitMismatch). TryAcquire's ErrNoSlot is not an
// event, so it is not counted; unfair waiters are not stored in Redis, so
// their queue length is always 0. StatusCollector reads the semaphores it
// is given, labelled by their Name: give it semaphores of their own, not a
// family's members (whose names are their keys).
// docs/operations.md has alert rules built on these metrics.
package redsemprom
