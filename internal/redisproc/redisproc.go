// Package redisproc starts and stops throw-away redis-server processes: one
// from PATH, on a free loopback port, with no persistence and a temporary
// directory. The test helper internal/redistest and the bench tool
// (cmd/redsem bench) both use it, so there is one implementation of
// "start a redis-server".
package redisproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one redis-server process. Its methods are safe for concurrent use.
type Proc struct {
	Addr string // 127.0.0.1:port

	mu   sync.Mutex
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	// exited is closed once cmd has exited and been reaped.
	exited chan struct{}
}

// Start starts redis-server from PATH on a free loopback port, with
// --save "" --appendonly no and a fresh temporary directory, plus
// extraArgs (e.g. "--maxmemory", "1mb"), and returns once it answers PING.
// The server is killed if the calling process dies (Linux parent-death
// signal), so a crashed caller leaves no server behind.
func Start(extraArgs ...string) (*Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redisproc-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		p := &Proc{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: dir}
		p.args = append([]string{bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
		}, extraArgs...)
		if lastErr = p.launchLocked(); lastErr == nil {
			return p, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// Restart kills the server and starts a fresh one (no data survives) on the
// same port, waiting until it answers.
func (p *Proc) Restart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	var err error
	for i := 0; i < 50; i++ { // the port may take a moment to free up
		if err = p.launchLocked(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("redisproc: restart on port %d: %w", p.port, err)
}

// Kill stops the server with SIGKILL and waits for it to exit. Killing a
// server that is not running does nothing.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

// Signal sends sig (e.g. SIGSTOP, SIGCONT) to the running server.
func (p *Proc) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("redisproc: server %s is not running", p.Addr)
	}
	return p.cmd.Process.Signal(sig)
}

// Pid is the server's process id, or 0 when it is not running.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop kills the server and removes its directory. It is safe to call twice.
func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
		p.dir = ""
	}
}

func (p *Proc) killLocked() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused server must be able to die
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// launchLocked starts the process and waits until it answers PING.
func (p *Proc) launchLocked() error {
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Dir = p.dir
	// The server dies with its parent even if no cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if Ping(p.Addr) == nil {
			p.cmd, p.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			deadline = time.Now()
		case <-time.After(10 * time.Millisecond):
		}
	}
	_ = cmd.Process.Kill()
	<-exited
	log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	return fmt.Errorf("redis-server on %s did not start: %s", p.Addr, lastLine(string(log)))
}

// Ping sends one inline PING to addr on a fresh connection and returns nil
// if the answer is PONG.
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(buf[:n]), "+PONG") {
		return errors.New(strings.TrimSpace(string(buf[:n])))
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
