package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// Proxy is a small TCP proxy between clients and a Redis server that
// injects network faults at random: it can lose the reply to a request
// after Redis executed it (the connection is closed instead of forwarding
// the reply) and reset a connection before a request reaches Redis. Tests
// use it to make calls whose outcome the client cannot know.
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
	dropped  int     // replies lost so far
	killed   int     // connections reset so far
	closed   bool
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
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
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
		go p.serve(c)
	}
}

// fate draws what happens to one chunk of requests read from a client.
func (p *Proxy) fate() (drop, kill bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
			if n > 0 {
				drop, kill := p.fate()
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
		if n > 0 {
			mu.Lock()
			lose := poisoned
			mu.Unlock()
			if lose {
				return // the request ran; its reply is lost with the connection
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
