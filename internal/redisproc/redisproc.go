// Package redisproc starts throw-away redis-server processes: Start for
// tools that need a Redis and find none (the demo and bench of the redsem
// command), and Run, the one implementation of "start a server process and
// wait until it answers", on which internal/testkit/redistest builds its test
// servers, clusters and sentinels. Binary says which server binary they
// start: redis-server from PATH, or the one $REDSEM_REDIS_SERVER names
// (how the tests run against Valkey).
package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is returned by Start when no redis-server is on PATH (and
// $REDSEM_REDIS_SERVER is not set).
var ErrNotFound = errors.New("redisproc: redis-server not found on PATH")

// EnvServer is the environment variable that names the server binary to
// start instead of redis-server from PATH: a path, or a name looked up on
// PATH. A server that picks its mode by the name it is run under must be
// named so: Valkey's single binary (Debian's valkey-check-rdb) is a server
// only when run as valkey-server or redis-server, e.g. through a symlink of
// that name.
const EnvServer = "REDSEM_REDIS_SERVER"

// Binary returns the path of the server binary to start: the one
// $REDSEM_REDIS_SERVER names when it is set, else redis-server from PATH
// (ErrNotFound when there is none). A binary that $REDSEM_REDIS_SERVER names
// but that cannot be found is an error other than ErrNotFound: the caller
// asked for that server, so it must not fall back to another.
func Binary() (string, error) {
	if name := os.Getenv(EnvServer); name != "" {
		bin, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("redisproc: %s=%s: %w", EnvServer, name, err)
		}
		return bin, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrNotFound
	}
	return bin, nil
}

// Proc is one redis-server process started by Start.
type Proc struct {
	addr    string
	bin     string
	version string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Start runs the server Binary names (redis-server from PATH by default) on
// a free 127.0.0.1 port, with no persistence and its files in a new
// temporary directory, and returns once it answers PING (or ctx ends, or it
// fails to start). Call Stop when done.
func Start(ctx context.Context) (*Proc, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redsem-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a free port may be taken before we bind it
		p, err := launch(ctx, bin, dir)
		if err == nil {
			p.dir = dir
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
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return Run(ctx, []string{bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log")}, dir, addr)
}

// Run starts argv (argv[0] is the redis-server binary) in dir and returns
// once the server answers PING at addr, or fails when it exits, ctx ends or
// five seconds pass. The process dies with this one (Linux). Its log is read
// from dir/redis.log for the error. Stop or Kill it when done; Run does not
// remove dir.
func Run(ctx context.Context, argv []string, dir, addr string) (*Proc, error) {
	return RunEnv(ctx, argv, nil, dir, addr)
}

// RunEnv is Run with env ("NAME=value") added to this process's environment
// for the server, e.g. an LD_PRELOAD library that moves its wall clock.
func RunEnv(ctx context.Context, argv, env []string, dir, addr string) (*Proc, error) {
	p := &Proc{addr: addr, bin: argv[0]}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Dir = dir
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
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
	p.Kill()
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	return nil, fmt.Errorf("redisproc: %s on %s did not start: %s", filepath.Base(p.bin), p.addr, lastLine(string(log)))
}

// Addr is the server's host:port.
func (p *Proc) Addr() string { return p.addr }

// Path is the redis-server binary that runs.
func (p *Proc) Path() string { return p.bin }

// Version is the server's version, e.g. "7.0.15" ("" if it did not say);
// for Valkey its own version (valkey_version, e.g. "8.0.1"), not the Redis
// version it claims compatibility with.
func (p *Proc) Version() string { return p.version }

// Stop ends the server (SIGTERM, then SIGKILL after two seconds), waits for
// it to exit and removes its directory if Start made it. It is safe to call
// twice.
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sigterm)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Second):
		p.Kill()
	}
	p.cmd = nil
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

// Kill ends the server with SIGKILL (continuing it first, should it be
// stopped) and waits for it to exit.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	if sigcont != nil {
		_ = p.Signal(sigcont)
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Signal sends sig to the server process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// ping sends PING then INFO server and returns the server's version:
// valkey_version when the server reports one, else redis_version.
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
	// Answered PING: the version is a nicety, so any trouble below gives "".
	line, err = r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "$") {
		return "", nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 0 {
		return "", nil
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(r, info); err != nil {
		return "", nil
	}
	var version string
	for _, l := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(l, "valkey_version:"); ok {
			return strings.TrimSpace(v), nil
		}
		if v, ok := strings.CutPrefix(l, "redis_version:"); ok {
			version = strings.TrimSpace(v)
		}
	}
	return version, nil
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

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "no log output"
	}
	lines := strings.Split(s, "\n")
	return lines[len(lines)-1]
}
