// Package redistest gives tests a real Redis: a throw-away redis-server
// started from PATH on a free loopback port, the server named by REDIS_URL,
// or (when neither can be had, a Docker engine can, and the test binary
// imports internal/testkit/container) a container started through
// testcontainers-go. Every test in this repository gets its Redis here.
// With REDSEM_REDIS_SERVER set (see redisproc.Binary), the servers it starts
// run that binary instead of redis-server, e.g. Valkey's, and no container
// stands in for it. With REDSEM_TEST_NO_FUNCTION set (EnvNoFunction), the
// servers it starts refuse FUNCTION and FCALL, as Redis 6.2 and some
// managed services do, so that the scripts run as EVALSHA.
//
// Use Client for a client of the package's shared server (started once per
// test binary, stopped by Main), Start for a dedicated server that the test
// may restart or kill, Name for a semaphore name unique to the test, and
// StartProxy for a TCP proxy in front of a server that loses replies and
// resets connections. NewDelayer gives a client a fault layer that only
// delays (replies after Redis ran the command, pub/sub messages), and
// ReadLayout with Layout.Check checks a semaphore's keys against
// lua/lib_*.lua's invariants. StartWallClock starts a server whose wall
// clock the test steps forward and back (WallClock.Step), as NTP or a
// resumed virtual machine does.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redisproc"
)

// HowToGetRedis is the one line printed when no Redis can be had.
const HowToGetRedis = "redistest: no Redis available: install redis-server (apt-get install redis-server), " +
	"or set REDIS_URL=redis://host:port/db, or run a Docker engine (the property tests start redis:7 through testcontainers-go) (or fix REDSEM_REDIS_SERVER if set)"

// Server is one redis-server process owned by a test (or by the test binary).
type Server struct {
	Addr string // host:port

	mu   sync.Mutex
	port int
	dir  string
	args []string
	env  []string        // added to the server's environment (StartWallClock)
	proc *redisproc.Proc // nil when not running
	// external is set when the server is not ours (REDIS_URL or a
	// container): it cannot be restarted or killed.
	external bool
	url      string
	stopFn   func()
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Main runs the tests of a package and stops the shared server afterwards.
// Use it from TestMain: func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}

// Shared returns the test binary's shared server, starting it on first use.
// With REDIS_URL set it is that server. It fails the test with one clear line
// when no Redis can be had.
func Shared(t testing.TB) *Server {
	t.Helper()
	s, err := SharedServer()
	if err != nil {
		t.Fatalf("%s (%v)", HowToGetRedis, err)
	}
	return s
}

// SharedServer is Shared for code that has no testing.TB, such as Example
// functions: it returns the shared server, or the reason none can be had.
func SharedServer() (*Server, error) {
	sharedOnce.Do(startShared)
	return shared, sharedErr
}

func startShared() {
	if u := os.Getenv("REDIS_URL"); u != "" {
		opt, err := redis.ParseURL(u)
		if err != nil {
			sharedErr = fmt.Errorf("redistest: REDIS_URL: %w", err)
			return
		}
		shared = &Server{Addr: opt.Addr, external: true, url: u}
		return
	}
	shared, sharedErr = startLocal()
	if sharedErr != nil && os.Getenv(redisproc.EnvServer) == "" { // a server was asked for: no stand-in
		if s, err := startContainer(); err == nil {
			shared, sharedErr = s, nil
		}
	}
}

// SharedAddr returns the address of the shared server, starting it on first
// use; for examples, which have no *testing.T. It exits the test binary with
// one clear line when no Redis can be had.
func SharedAddr() string {
	s, err := SharedServer()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (%v)\n", HowToGetRedis, err)
		os.Exit(1)
	}
	return s.Addr
}

// Client returns a client of the shared server, closed when the test ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	return Shared(t).Client(t)
}

// Start starts a dedicated redis-server for this test (stopped when the test
// ends), so that the test may Restart, Kill or Pause it. extraArgs are passed
// to redis-server, e.g. "--maxmemory", "1mb". It never uses REDIS_URL.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	s, err := startLocal(extraArgs...)
	if err != nil {
		t.Fatalf("%s (%v)", HowToGetRedis, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Options returns go-redis options for this server: loopback address, short
// timeouts, and contexts honoured for every read and write.
func (s *Server) Options() *redis.Options {
	if s.url != "" {
		opt, err := redis.ParseURL(s.url)
		if err == nil {
			opt.ContextTimeoutEnabled = true
			return opt
		}
	}
	return clientOptions(s.Addr).Simple()
}

// clientOptions are the options of this package's clients of addrs (one
// server's, or a cluster's nodes'): short timeouts, and contexts honoured
// for every read and write.
func clientOptions(addrs ...string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 addrs,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
	}
}

// Client returns a new client of s, closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	return closeAtEnd(t, redis.NewClient(s.Options()))
}

// closeAtEnd closes c when the test ends, and returns it.
func closeAtEnd[C interface{ Close() error }](t testing.TB, c C) C {
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Restart stops the server and starts a fresh one (no data survives) on the
// same port, waiting until it answers.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.external {
		t.Fatalf("redistest: cannot restart a server this test does not own (%s)", s.Addr)
	}
	s.Kill(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for i := 0; i < 50; i++ { // the port may take a moment to free up
		if err = s.launchLocked(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart on port %d: %v", s.port, err)
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if s.external {
		t.Fatalf("redistest: cannot kill a server this test does not own (%s)", s.Addr)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Pause stops the server process with SIGSTOP; Resume continues it.
func (s *Server) Pause(t testing.TB)  { s.signal(t, syscall.SIGSTOP) }
func (s *Server) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("redistest: server %s is not running", s.Addr)
	}
	if err := s.proc.Signal(sig); err != nil {
		t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// LogTail returns the last n lines of the server's log file, or a note
// saying why there is none (an external server, a stopped one).
func (s *Server) LogTail(n int) string {
	s.mu.Lock()
	dir := s.dir
	s.mu.Unlock()
	if dir == "" {
		return "(no log: the server is external or stopped)"
	}
	b, err := os.ReadFile(filepath.Join(dir, "redis.log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop ends the server and removes its directory. It is safe to call twice.
func (s *Server) Stop() {
	if s.stopFn != nil {
		s.stopFn()
		s.stopFn = nil
		return
	}
	if s.external {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
		s.dir = ""
	}
}

func (s *Server) killLocked() {
	if s.proc == nil {
		return
	}
	s.proc.Kill() // continues a paused server first
	s.proc = nil
}

// startLocal starts redis-server from PATH (or the binary
// REDSEM_REDIS_SERVER names) on a free loopback port.
func startLocal(extraArgs ...string) (*Server, error) {
	return startLocalEnv(nil, extraArgs...)
}

// EnvNoFunction is the environment variable that, when set, makes every
// server this package starts refuse FUNCTION, FCALL and FCALL_RO (renamed
// away), so that the library keeps to EVALSHA: the path of a server
// without functions (Redis 6.2, some managed services) and of each
// engine's first calls, which the tests otherwise reach only in part. A
// test that checks the library's use of FUNCTION fails under it.
const EnvNoFunction = "REDSEM_TEST_NO_FUNCTION"

// startLocalEnv is startLocal with env added to the server's environment.
func startLocalEnv(env []string, extraArgs ...string) (*Server, error) {
	bin, err := redisproc.Binary()
	if err != nil {
		return nil, err
	}
	if os.Getenv(EnvNoFunction) != "" {
		extraArgs = append([]string{"--rename-command", "FUNCTION", "",
			"--rename-command", "FCALL", "", "--rename-command", "FCALL_RO", ""}, extraArgs...)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: dir, env: env}
		s.args = append([]string{bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
		}, extraArgs...)
		if lastErr = s.launchLocked(); lastErr == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// launchLocked starts the process and waits until it answers PING; the
// server dies with the test binary even if no cleanup runs.
func (s *Server) launchLocked() error {
	p, err := redisproc.RunEnv(context.Background(), s.args, s.env, s.dir, s.Addr)
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) { return redisproc.FreePort() }

// Name returns a semaphore name unique to this test and run.
func Name(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return n + "-" + hex.EncodeToString(b[:])
}

// Ctx returns a context that ends with the test or after d, whichever first.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond every few milliseconds until it returns true, and
// fails the test (naming what) if it has not after d or if it returns an
// error. Tests wait for a state with it, never for a fixed time.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
