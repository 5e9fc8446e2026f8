// Package redsemotel instruments a redsem.Semaphore with OpenTelemetry,
// through the OpenTelemetry API only (no SDK among its dependencies): the
// application chooses and configures the SDK and its exporters.
//
//	sem = redsemotel.Wrap(sem)              // global providers; or WithTracerProvider, WithMeterProvider
//	tenants := redsemotel.WrapFamily(family) // a keyed family: labelled by the family, not by key
//
// It is a decorator over the redsem.Semaphore interface, so it wraps either
// variant (fair, unfair, a family member) and composes with the other
// integrations: pass the wrapped semaphore to redsemhttp or redsemsql.
// The tracer and the meter have the instrumentation scope ScopeName
// ("github.com/redsem/redsem/redsemotel") with the module's version,
// Version().
//
// # Spans
//
// Every Acquire, AcquireN, TryAcquire and TryAcquireN makes a span
// "redsem.acquire", a child of the span in its context, ended when the
// call returns; every lease it grants makes a span "redsem.hold", a child of
// the same span (a sibling of the acquire span), from the grant to the
// lease's release or loss (WithoutHoldSpans leaves them out: under
// redsemsql a hold lasts as long as a pooled connection). Both carry
//
//	redsem.semaphore.name     the semaphore's name; for a member of a WrapFamily, the family's
//	redsem.semaphore.key      a WrapFamily member's key
//	redsem.semaphore.variant  fair or unfair (absent for other implementations)
//	redsem.acquire.weight     the slots asked for
//
// and, on a granted acquire and on the hold, redsem.lease.token (int64) and
// redsem.lease.slots (an int slice), and the attributes of WithAttributes.
// A failed acquire sets error.type (ErrorType), and no RecordError event:
//
//	no_slot       TryAcquire refused (redsem.ErrNoSlot)
//	rate_limited  TryAcquire refused by the rate (redsem.ErrRateLimited)
//	queue_full    a fair AcquireN refused, Options.MaxWaiters queued (redsem.ErrQueueFull)
//	timeout       the context's deadline passed (context.DeadlineExceeded)
//	canceled      the context was cancelled (context.Canceled)
//	closed        the semaphore was closed (redsem.ErrClosed)
//	unavailable   Redis could not be reached (redsem.ErrUnavailable)       status Error
//	_OTHER        any other error (redsem.ErrWeight, a limit mismatch, ...) status Error
//
// A hold that ends by the lease's loss sets error.type lease_lost, status
// Error; a released one, none. A lease that Resume returns (a lease handed
// on by another process) starts a "redsem.hold" span too, a child of the
// span in Resume's context, and counts in redsem.client.slot.usage until
// it ends; Resume of a lease held already through the same instruments
// returns its wrapped lease and counts nothing twice.
//
// # Metrics
//
// Each with redsem.semaphore.name, redsem.semaphore.variant and the
// attributes of WithAttributes (and a WrapFamily member's
// redsem.semaphore.key only with WithKeyAttribute):
//
//	redsem.client.acquire.duration  Float64Histogram    s          error.type on failure
//	redsem.client.hold.duration     Float64Histogram    s          error.type lease_lost when lost
//	redsem.client.slot.usage        Int64UpDownCounter  {slot}     slots held by this process's leases
//	redsem.client.acquire.pending   Int64UpDownCounter  {request}  acquire calls waiting in this process
//	redsem.client.lease.lost        Int64Counter        {lease}    leases lost before their release
//
// The histograms advise explicit bucket boundaries in seconds (a View may
// override them): acquire 0.5 ms, 1 ms, 2.5 ms, then the semantic
// conventions' 5 ms ... 10 s, then 30 s and 60 s; hold 5 ms to 8 h.
//
// With WithStatusMetrics (Wrap only), observable gauges read from the
// semaphore's Status, one Redis round trip per collection (at most 2 s):
// what every process holds, as redsemprom's StatusCollector shows:
//
//	redsem.semaphore.limit       Int64ObservableGauge  {slot}     the limit in force
//	redsem.semaphore.usage       Int64ObservableGauge  {slot}     slots held, all processes
//	redsem.semaphore.queue.size  Int64ObservableGauge  {request}  fair waiters queued, all processes
//
// # Cardinality
//
// A family member's name is its key (a tenant, an API key): Wrap(member)
// makes each key a metric series. WrapFamily labels the metrics by the
// family's name and puts the key on the spans only; WithKeyAttribute puts
// it on the metrics too, for families with few keys.
//
// # Leases
//
// A granted lease is returned wrapped: every Lease method (ID, Slot, Slots,
// Token, Deadline, Renew, Release, Done, Err, Context) is the semaphore's
// own, unchanged. The hold span, and the hold's metrics, end exactly once:
// in Release, before it returns (released, or lost if Release returns
// redsem.ErrLeaseLost), or when the lease is lost without a Release
// (lost, counted in redsem.client.lease.lost). A goroutine per lease waits
// for its Done and ends with it: nothing runs after a lease ends. A
// Release that fails with another error (Redis unreachable) leaves the
// lease held and its span open.
//
// Unwrap on the returned semaphore gives back the semaphore that Wrap
// instrumented; on a lease, the lease it granted.
//
// # Migration from the first version
//
// The names now follow OpenTelemetry's naming rules; dashboards and
// queries need the new ones (Go code that used the constants compiles
// unchanged: the old ones are deprecated aliases of the new keys):
//
//	redsem.acquire.duration  -> redsem.client.acquire.duration (buckets in seconds now)
//	redsem.hold.duration     -> redsem.client.hold.duration (buckets in seconds now)
//	redsem.slots.held        -> redsem.client.slot.usage
//	redsem.acquire.waiting   -> redsem.client.acquire.pending (unit {request})
//	redsem.leases.lost       -> redsem.client.lease.lost
//	redsem.semaphore         -> redsem.semaphore.name   (AttrSemaphore -> AttrSemaphoreName)
//	redsem.weight            -> redsem.acquire.weight   (AttrWeight -> AttrAcquireWeight)
//	redsem.token             -> redsem.lease.token      (AttrToken -> AttrLeaseToken)
//	redsem.slots             -> redsem.lease.slots      (AttrSlots -> AttrLeaseSlots)
//	redsem.outcome           -> error.type on failure only (Outcome -> ErrorType):
//	                            granted, released: none; lost: lease_lost; error: _OTHER
//	                            (or unavailable); the others keep their names
//	RecordError              -> none (error.type and, for faults, status Error)
//	Scope                    -> ScopeName
//
// Span status Error is now set for unavailable, _OTHER and lease_lost
// (before: error and lost).
package redsemotel
