// Package redsemhttp bounds HTTP concurrency with a redsem.Semaphore, across
// every process that shares the semaphore's Redis.
//
// Middleware limits the requests a server handles at once: a request runs
// its handler only while it holds a lease of the semaphore that
// Options.Semaphore picks for it (one per route, per tenant, per API key),
// and the lease is released when the handler returns, also when it panics.
// A request that gets no lease within Options.MaxWait is answered 503
// Service Unavailable with a Retry-After header, and its handler never runs;
// one that the semaphore's rate held back (a slot was free, the rate's
// window was full) is answered 429 Too Many Requests with a Retry-After that
// says when the window has room.
//
// Transport limits the requests a client has in flight at once (an outbound
// API that allows 5 concurrent calls, whichever instance makes them): each
// request holds a lease from before it is sent until its response body is
// closed or read to EOF, or until the round trip fails. Close every
// response body, as net/http asks anyway: a body that is neither closed nor
// read to the end keeps its slot for as long as the process runs (the lease
// renews itself in the background) and so shrinks the limit for everyone.
//
// The semaphore is the caller's: neither Middleware nor Transport closes it.
// Releases run with a short timeout of their own (Options.ReleaseTimeout,
// Transport.ReleaseTimeout), detached from the request's context, so a
// cancelled request still frees its slot. If a release fails (Redis
// unreachable), the lease is no longer renewed and its slot comes back once
// the lease TTL passes.
package redsemhttp
