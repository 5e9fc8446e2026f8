// Package redsemotel instruments a redsem.Semaphore with OpenTelemetry,
// through the OpenTelemetry API only (no SDK among its dependencies): the
// application chooses and configures the SDK and its exporters.
//
//	sem = redsemotel.Wrap(sem) // global providers; or WithTracerProvider, WithMeterProvider
//
// It is a decorator over the redsem.Semaphore interface, so it wraps either
// variant (fair, unfair, a family member) and composes with the other
// integrations: pass the wrapped semaphore to redsemhttp or redsemsql.
//
// # Spans
//
// Every Acquire, AcquireN, TryAcquire and TryAcquireN makes a span
// "redsem.acquire", a child of the span in its context, ended when the
// call returns; every lease it grants makes a span "redsem.hold", a child of
// the same span (a sibling of the acquire span), from the grant to the
// lease's release or loss. Both carry redsem.semaphore (the name) and
// redsem.weight (the slots asked for). The acquire span also carries
// redsem.outcome:
//
//	granted   a lease was granted
//	no_slot   TryAcquire refused (errors.Is(err, redsem.ErrNoSlot), rate limit included)
//	timeout   the context's deadline passed (context.DeadlineExceeded)
//	canceled  the context was cancelled (context.Canceled)
//	closed    the semaphore was closed (redsem.ErrClosed)
//	error     any other error (also redsem.ErrWeight: n below 1 or above the limit)
//
// and, when granted, redsem.token (int64) and redsem.slots (the slots, an
// int slice). The hold span carries redsem.token, redsem.slots and
// redsem.outcome released or lost. A span's status is Error only for the
// outcomes error and lost.
//
// # Metrics
//
// Under the instrumentation scope "github.com/redsem/redsem/redsemotel",
// each with the attribute redsem.semaphore:
//
//	redsem.acquire.duration  Float64Histogram    s       and redsem.outcome (as on the acquire span)
//	redsem.hold.duration     Float64Histogram    s       and redsem.outcome (released, lost)
//	redsem.slots.held        Int64UpDownCounter  {slot}  slots held by this process's leases
//	redsem.acquire.waiting   Int64UpDownCounter  {call}  acquire calls in flight in this process
//	redsem.leases.lost       Int64Counter        {lease} leases lost before their release
//
// # Leases
//
// A granted lease is returned wrapped: every Lease method (ID, Slot, Slots,
// Token, Deadline, Renew, Release, Done, Err, Context) is the semaphore's
// own, unchanged. The hold span, and the hold's metrics, end exactly once:
// in Release, before it returns (outcome released, or lost if Release
// returns redsem.ErrLeaseLost), or when the lease is lost without a
// Release (outcome lost, counted in redsem.leases.lost). A goroutine per
// lease waits for its Done and ends with it: nothing runs after a lease
// ends. A Release that fails with another error (Redis unreachable) leaves
// the lease held and its span open.
//
// Unwrap on the returned semaphore gives back the semaphore that Wrap
// instrumented; on a lease, the lease it granted.
package redsemotel
