// Package redisproc starts a throw-away redis-server from PATH on a free
// loopback port, for tools that need a Redis and find none (the demo of the
// redsem command). It is not a test helper: tests use internal/redistest.
package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is returned by Start when no redis-server is on PATH.
var ErrNotFound = errors.New("redisproc: redis-server not found on PATH")

// Proc is one redis-server process started by Start.
type Proc struct {
	addr    string
	bin     string
	version string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Start runs redis-server from PATH on a free 127.0.0.1 port, with no
// persistence and its files in a new temporary directory, and returns once
// it answers PING (or ctx ends, or it fails to start). Call Stop when done.
func Start(ctx context.Context) (*Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNotFound
	}
	dir, err := os.MkdirTemp("", "redsem-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a free port may be taken before we bind it
		p, err := launch(ctx, bin, dir)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func launch(ctx context.Context, bin, dir string) (*Proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	p := &Proc{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir}
	logFile := filepath.Join(dir, "redis.log")
	p.cmd = exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", logFile)
	p.cmd.Dir = dir
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if v, err := ping(p.addr); err == nil {
			p.version = v
			return p, nil
		}
		select {
		case <-p.exited:
			deadline = time.Now()
		case <-ctx.Done():
			deadline = time.Now()
		case <-time.After(10 * time.Millisecond):
		}
	}
	p.kill()
	log, _ := os.ReadFile(logFile)
	return nil, fmt.Errorf("redisproc: redis-server on %s did not start: %s", p.addr, lastLine(string(log)))
}

// Addr is the server's host:port.
func (p *Proc) Addr() string { return p.addr }

// Path is the redis-server binary that runs.
func (p *Proc) Path() string { return p.bin }

// Version is the server's version, e.g. "7.0.15" ("" if it did not say).
func (p *Proc) Version() string { return p.version }

// Stop ends the server (SIGTERM, then SIGKILL after two seconds), waits for
// it to exit and removes its directory. It is safe to call twice.
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sigterm)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Second):
		p.kill()
	}
	p.cmd = nil
	_ = os.RemoveAll(p.dir)
}

func (p *Proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// ping sends PING then INFO server and returns the redis_version it reports.
func ping(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return "", errors.New(strings.TrimSpace(line))
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", nil // answered PING: the version is a nicety
		}
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "no log output"
	}
	lines := strings.Split(s, "\n")
	return lines[len(lines)-1]
}
