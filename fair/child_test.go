package fair_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
)

// A child is this test binary re-executed as a separate process that waits
// on a fair semaphore, so that tests can kill it (SIGKILL) or pause it
// (SIGSTOP) like a real crashed or frozen client.
//
// Protocol: the child acquires, then prints
//
//	acquired <id> <slot> <token> <held>
//
// where held is "held" if Status right after Acquire listed the lease among
// the holders, else "phantom". It then waits for a line "release" on stdin,
// releases and prints "released <error or ok>", and exits.
const childEnv = "REDSEM_FAIR_CHILD"

type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// childConfig is what a child is told through its environment.
type childConfig struct {
	addr     string
	name     string
	limit    int
	queueTTL time.Duration
	leaseTTL time.Duration
}

func startChild(t *testing.T, cfg childConfig) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"CHILD_ADDR="+cfg.addr,
		"CHILD_NAME="+cfg.name,
		fmt.Sprintf("CHILD_LIMIT=%d", cfg.limit),
		fmt.Sprintf("CHILD_QUEUE_TTL=%s", cfg.queueTTL),
		fmt.Sprintf("CHILD_LEASE_TTL=%s", cfg.leaseTTL),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

func (c *child) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %v to child: %v", sig, err)
	}
}

// stop freezes the child with SIGSTOP and returns once it is stopped: the
// signal is asynchronous, and a child still running could act (take a
// grant, print) after the test believes it frozen.
func (c *child) stop() {
	c.t.Helper()
	c.signal(syscall.SIGSTOP)
	stat := fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		if err != nil {
			c.t.Fatalf("child state: %v", err)
		}
		// "pid (comm) state ...": the state follows the last ')'.
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && (f[0] == "T" || f[0] == "t") {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatal("child did not stop within 10s of SIGSTOP")
		}
		time.Sleep(time.Millisecond)
	}
}

// kill ends the child with SIGKILL, as a crash would, and reaps it.
func (c *child) kill() {
	c.t.Helper()
	c.signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// line returns the child's next output line, failing the test after d.
func (c *child) line(d time.Duration) string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatal("child exited without output")
		}
		return l
	case <-time.After(d):
		c.t.Fatalf("no output from child within %v", d)
	}
	return ""
}

// noLine asserts that the child has printed nothing so far.
func (c *child) noLine() {
	c.t.Helper()
	select {
	case l := <-c.lines:
		c.t.Fatalf("child printed %q too early", l)
	default:
	}
}

// acquired waits for the child's "acquired" line and returns its fields.
func (c *child) acquired(d time.Duration) (id, held string) {
	c.t.Helper()
	f := strings.Fields(c.line(d))
	if len(f) != 5 || f[0] != "acquired" {
		c.t.Fatalf("child said %q, want acquired ...", strings.Join(f, " "))
	}
	return f[1], f[4]
}

func (c *child) release(d time.Duration) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, "release\n"); err != nil {
		c.t.Fatal(err)
	}
	if l := c.line(d); l != "released ok" {
		c.t.Fatalf("child said %q, want released ok", l)
	}
}

// childMain is the child process: it exits 0 after a release, 2 on errors.
func childMain() int {
	die := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
		return 2
	}
	var limit int
	if _, err := fmt.Sscan(os.Getenv("CHILD_LIMIT"), &limit); err != nil {
		return die("limit: %v", err)
	}
	qttl, err := time.ParseDuration(os.Getenv("CHILD_QUEUE_TTL"))
	if err != nil {
		return die("queue ttl: %v", err)
	}
	lttl, err := time.ParseDuration(os.Getenv("CHILD_LEASE_TTL"))
	if err != nil {
		return die("lease ttl: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("CHILD_ADDR")})
	defer c.Close()
	s, err := fair.New(c, os.Getenv("CHILD_NAME"), limit, fair.Options{QueueTTL: qttl, LeaseTTL: lttl})
	if err != nil {
		return die("new: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	l, err := s.Acquire(ctx)
	if err != nil {
		return die("acquire: %v", err)
	}
	held := "phantom"
	if st, err := s.Status(ctx); err == nil && slices.ContainsFunc(st.Holders, func(h redsem.Holder) bool { return h.ID == l.ID() }) {
		held = "held"
	}
	fmt.Printf("acquired %s %d %d %s\n", l.ID(), l.Slot(), l.Token(), held)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "release" {
			res := "ok"
			if err := l.Release(ctx); err != nil {
				res = err.Error()
			}
			fmt.Printf("released %s\n", res)
			return 0
		}
	}
	return 0
}
