package redistest

import (
	"bytes"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a small TCP proxy between clients and a Redis server that
// injects network faults at random: it can lose the reply to a request
// after Redis executed it (the connection is closed instead of forwarding
// the reply) and reset a connection before a request reaches Redis. Tests
// use it to make calls whose outcome the client cannot know. It can also
// black-hole everything (SetBlackhole: a partition, or a server that accepts
// and never answers), hold requests before forwarding them (SetDelay: a
// server that answers slowly), lose the replies of chosen requests
// (DropMatching), add jitter (SetJitter), reset every connection
// (ResetAll) and hold everything in one or both directions without losing
// a byte (SetStall: a partition that heals before TCP gives up).
type Proxy struct {
	// Addr is the address clients dial instead of the server's.
	Addr string

	target string
	ln     net.Listener

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	dropProb float64 // chance that a request's reply is lost
	killProb float64 // chance that a request's connection is reset before it is forwarded
	dropNext int     // replies of the next requests to lose, whatever the odds
	dropOn   []byte  // DropMatching's marker
	dropOnN  int     // replies of requests containing dropOn still to lose; < 0: all
	jitter   time.Duration
	dropped  int  // replies lost so far
	killed   int  // connections reset so far
	hole     bool // black hole: nothing is forwarded either way
	delay    time.Duration
	delayOn  []byte        // only requests containing it are delayed; nil: all
	watch    []byte        // Watch's marker
	watched  int           // requests read that contain watch
	stallReq chan struct{} // non-nil while requests are held: closed when SetStall lets them go
	stallRep chan struct{} // the same for replies
	closed   bool
	quit     chan struct{} // closed by Close: ends delays
	wg       sync.WaitGroup
}

// StartProxy starts a proxy in front of target (host:port) that forwards
// everything faithfully until SetFaults is called. It is closed when the
// test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}, quit: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// SetFaults sets, for every request read from a client from now on, the
// probability that its reply is lost after Redis ran it (drop) and the
// probability that its connection is reset before Redis sees it (kill).
// Zero for both makes the proxy faithful again.
func (p *Proxy) SetFaults(drop, kill float64) {
	p.mu.Lock()
	p.dropProb, p.killProb = drop, kill
	p.mu.Unlock()
}

// DropNext makes the proxy lose the replies to the next n requests read
// from any client (after Redis ran them), on top of SetFaults' odds.
func (p *Proxy) DropNext(n int) {
	p.mu.Lock()
	p.dropNext += n
	p.mu.Unlock()
}

// DropMatching makes the proxy lose the replies to the next n requests that
// contain marker, after Redis ran them (n < 0: every one of them; n == 0 or
// a nil marker: none again). It replaces an earlier DropMatching.
func (p *Proxy) DropMatching(marker []byte, n int) {
	p.mu.Lock()
	p.dropOn, p.dropOnN = marker, n
	p.mu.Unlock()
}

// SetJitter delays every chunk forwarded, in either direction, by a random
// time in [0, d): a network whose latency varies. Zero: no jitter.
func (p *Proxy) SetJitter(d time.Duration) {
	p.mu.Lock()
	p.jitter = d
	p.mu.Unlock()
}

// ResetAll resets every connection open now (clients see a reset or EOF
// and dial again; new connections are served as before) and returns how
// many it closed, client and server sides counted apart.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	open := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
		delete(p.conns, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST rather than FIN
		}
		_ = c.Close()
	}
	return len(open)
}

// SetBlackhole turns the black hole on or off. While on, the proxy forwards
// nothing in either direction: connections are still accepted (a client's
// dial succeeds), requests are read and thrown away, and replies Redis sends
// to requests forwarded earlier are thrown away too, so every client waits
// for an answer that never comes (a partition, or a server that hangs).
// Turning it off closes every connection open at that moment (their
// clients see a reset and dial again, as after a partition that a
// stateful firewall forgot) and serves new connections faithfully.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	p.hole = on
	p.mu.Unlock()
	if !on {
		p.ResetAll()
	}
}

// SetStall holds what clients send (requests) and what Redis sends
// (replies), each direction on or off, until a later call lets it go: the
// held bytes are then forwarded in order, nothing lost, and connections stay
// open (a partition that heals before TCP gives up; a request sent during it
// runs late, a reply to a request that ran before it arrives late). Held
// requests were read by the proxy but not yet seen by Redis (Watch counts
// them once forwarded). New connections are accepted and held the same way.
// SetStall(false, false) ends the stall.
func (p *Proxy) SetStall(requests, replies bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stallReq = restall(p.stallReq, requests)
	p.stallRep = restall(p.stallRep, replies)
}

// restall returns the gate of one direction: the open gate g (a new one if
// none) while on, nil once off (closing g lets its held bytes go).
func restall(g chan struct{}, on bool) chan struct{} {
	switch {
	case on && g == nil:
		return make(chan struct{})
	case !on && g != nil:
		close(g)
		return nil
	}
	return g
}

// pass waits while the direction (requests or replies) is stalled; it
// reports false if the proxy was closed meanwhile.
func (p *Proxy) pass(requests bool) bool {
	p.mu.Lock()
	g := p.stallRep
	if requests {
		g = p.stallReq
	}
	p.mu.Unlock()
	if g == nil {
		return true
	}
	select {
	case <-g:
		return true
	case <-p.quit:
		return false
	}
}

// SetDelay holds every request read from a client from now on for d before
// forwarding it (and, on the same connection, the requests behind it), or
// only requests that contain marker when marker is not nil: a server that
// answers slowly, or one slow command. Zero d forwards at once again.
func (p *Proxy) SetDelay(d time.Duration, marker []byte) {
	p.mu.Lock()
	p.delay, p.delayOn = d, marker
	p.mu.Unlock()
}

// Watch starts counting the requests read from clients that contain
// marker, from zero, once each was forwarded to Redis (or thrown away by
// the black hole); Watched returns the count. Tests wait with it until a
// request has reached the server's socket.
func (p *Proxy) Watch(marker []byte) {
	p.mu.Lock()
	p.watch, p.watched = marker, 0
	p.mu.Unlock()
}

// Watched returns how many requests containing Watch's marker were read.
func (p *Proxy) Watched() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watched
}

// saw counts req if it contains Watch's marker.
func (p *Proxy) saw(req []byte) {
	p.mu.Lock()
	if p.watch != nil && bytes.Contains(req, p.watch) {
		p.watched++
	}
	p.mu.Unlock()
}

// holding reports whether the black hole is on.
func (p *Proxy) holding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}

// wait holds a request for the delay set by SetDelay, if it applies to it;
// it reports false if the proxy was closed meanwhile.
func (p *Proxy) wait(req []byte) bool {
	p.mu.Lock()
	d, marker := p.delay, p.delayOn
	p.mu.Unlock()
	if d <= 0 || (marker != nil && !bytes.Contains(req, marker)) {
		return true
	}
	return p.sleep(d)
}

// sleep waits d; it reports false if the proxy was closed meanwhile.
func (p *Proxy) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.quit:
		return false
	}
}

// jitterSleep waits a random time below SetJitter's bound; it reports
// false if the proxy was closed meanwhile.
func (p *Proxy) jitterSleep() bool {
	p.mu.Lock()
	j := p.jitter
	p.mu.Unlock()
	if j <= 0 {
		return true
	}
	return p.sleep(rand.N(j))
}

// Faults returns how many replies were lost and how many connections were
// reset so far.
func (p *Proxy) Faults() (dropped, killed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped, p.killed
}

// Close stops the proxy and closes every connection. It is safe to call
// twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		close(p.quit)
	}
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		if p.holding() {
			// Accepted, never answered, never forwarded (not even once
			// the hole closes: healing closes this connection).
			go func() {
				defer p.wg.Done()
				defer p.untrack(c)
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						p.saw(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
			continue
		}
		go p.serve(c)
	}
}

// fate draws what happens to one chunk of requests read from a client.
func (p *Proxy) fate(req []byte) (drop, kill bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropOnN != 0 && p.dropOn != nil && bytes.Contains(req, p.dropOn) {
		if p.dropOnN > 0 {
			p.dropOnN--
		}
		p.dropped++
		return true, false
	}
	if p.dropNext > 0 {
		p.dropNext--
		p.dropped++
		return true, false
	}
	r := rand.Float64()
	switch {
	case r < p.killProb:
		p.killed++
		return false, true
	case r < p.killProb+p.dropProb:
		p.dropped++
		return true, false
	}
	return false, false
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(s) {
		p.untrack(c)
		return
	}
	defer p.untrack(c, s)
	var mu sync.Mutex
	poisoned := false // a request was forwarded whose reply must be lost
	p.wg.Add(1)
	go func() { // client -> Redis
		defer p.wg.Done()
		defer p.untrack(c, s)
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 && p.holding() {
				p.saw(buf[:n])
				n = 0 // thrown away
			}
			if n > 0 && !p.wait(buf[:n]) {
				return
			}
			if n > 0 {
				drop, kill := p.fate(buf[:n])
				if kill {
					if tc, ok := c.(*net.TCPConn); ok {
						_ = tc.SetLinger(0) // RST rather than FIN
					}
					return
				}
				if drop {
					mu.Lock()
					poisoned = true
					mu.Unlock()
				}
				if !p.jitterSleep() || !p.pass(true) {
					return
				}
				// Counted before it goes on: once forwarded, its reply may
				// reach the client (and the test read Watched) first.
				p.saw(buf[:n])
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for { // Redis -> client
		n, err := s.Read(buf)
		if n > 0 && p.holding() {
			n = 0 // thrown away
		}
		if n > 0 {
			mu.Lock()
			lose := poisoned
			mu.Unlock()
			if lose {
				return // the request ran; its reply is lost with the connection
			}
			if !p.jitterSleep() || !p.pass(false) {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
