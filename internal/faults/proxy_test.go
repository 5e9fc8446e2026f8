package faults_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redistest"
)

// proxy is a tiny TCP proxy between a client and Redis that can lose the
// reply to a request after Redis has executed it (it reads the reply, then
// closes both connections instead of forwarding it), or black-hole every
// connection (accept, read, never answer). toxiproxy has no toxic that
// drops exactly one reply after the request ran, and brings ~15 modules
// (prometheus, protobuf, gorilla/mux, zerolog) with it, so this is in-test.
type proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	marker    []byte // a request containing it has its reply dropped
	drops     int    // how many more replies to drop; < 0: all
	dropped   int    // replies dropped so far
	blackhole bool
	jitter    time.Duration // each forwarded chunk waits a random [0, jitter)
	closed    bool
	wg        sync.WaitGroup
}

// proxied starts a redis-server with a proxy in front of it, and returns
// the proxy, a client that goes through it and one that does not.
func proxied(t *testing.T) (p *proxy, viaProxy, direct *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	p = newProxy(t, srv.Addr)
	opt := srv.Options()
	opt.Addr = p.Addr
	viaProxy = redis.NewClient(opt)
	t.Cleanup(func() { _ = viaProxy.Close() })
	return p, viaProxy, srv.Client(t)
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// dropReplies makes the proxy lose the replies to the next n requests that
// contain marker (n < 0: all of them).
func (p *proxy) dropReplies(marker []byte, n int) {
	p.mu.Lock()
	p.marker, p.drops = marker, n
	p.mu.Unlock()
}

func (p *proxy) droppedReplies() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// setBlackhole makes new connections hang: accepted, never answered.
func (p *proxy) setBlackhole() {
	p.mu.Lock()
	p.blackhole = true
	p.mu.Unlock()
}

// setJitter delays every forwarded chunk by a random time in [0, d).
func (p *proxy) setJitter(d time.Duration) {
	p.mu.Lock()
	p.jitter = d
	p.mu.Unlock()
}

// delay sleeps for the configured jitter.
func (p *proxy) delay() {
	p.mu.Lock()
	j := p.jitter
	p.mu.Unlock()
	if j > 0 {
		time.Sleep(rand.N(j))
	}
}

// resetAll closes every connection open now (clients see resets and EOFs);
// new connections are served as before.
func (p *proxy) resetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST rather than FIN
		}
		_ = c.Close()
		delete(p.conns, c)
	}
	return n
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.mu.Lock()
		hole := p.blackhole
		p.mu.Unlock()
		p.wg.Add(1)
		if hole {
			go func() { defer p.wg.Done(); _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(s) {
		_ = c.Close()
		return
	}
	var poisonMu sync.Mutex
	poisoned := false
	closeBoth := func() { _ = c.Close(); _ = s.Close() }
	p.wg.Add(1)
	go func() { // client -> Redis
		defer p.wg.Done()
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				p.mu.Lock()
				if p.drops != 0 && p.marker != nil && bytes.Contains(buf[:n], p.marker) {
					if p.drops > 0 {
						p.drops--
					}
					p.dropped++
					poisonMu.Lock()
					poisoned = true
					poisonMu.Unlock()
				}
				p.mu.Unlock()
				p.delay()
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	buf := make([]byte, 64<<10)
	for { // Redis -> client
		n, err := s.Read(buf)
		if n > 0 {
			poisonMu.Lock()
			lose := poisoned
			poisonMu.Unlock()
			if lose {
				return // the request ran; its reply is lost with the connection
			}
			p.delay()
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
