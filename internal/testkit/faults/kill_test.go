package faults_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Environment of a child process started by startChild.
const (
	envRole  = "REDSEM_FAULTS_ROLE" // "acquire": Acquire, print "held <id> <slot> <token> <deadline ns>", then idle
	envAddr  = "REDSEM_FAULTS_ADDR"
	envName  = "REDSEM_FAULTS_NAME"
	envFair  = "REDSEM_FAULTS_FAIR"
	envLimit = "REDSEM_FAULTS_LIMIT"
	envLease = "REDSEM_FAULTS_LEASE_MS"
	envQueue = "REDSEM_FAULTS_QUEUE_MS"
)

// TestHelperProcess is not a test: it is the body of the child processes
// that the fault tests start (this test binary re-run with -test.run), which
// acquire a slot and then hold it (or wait for it) until they are killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envRole) != "acquire" {
		t.Skip("runs only as a child process of the fault tests")
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	limit, _ := strconv.Atoi(os.Getenv(envLimit))
	leaseMs, _ := strconv.Atoi(os.Getenv(envLease))
	queueMs, _ := strconv.Atoi(os.Getenv(envQueue))
	v := variants[0]
	if os.Getenv(envFair) == "1" {
		v = variants[1]
	}
	s := v.new(t, c, os.Getenv(envName), limit, opts{
		LeaseTTL: time.Duration(leaseMs) * time.Millisecond,
		QueueTTL: time.Duration(queueMs) * time.Millisecond, Fallback: 200 * time.Millisecond,
	})
	fmt.Println("started")
	l, err := s.Acquire(context.Background())
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("held", l.ID(), l.Slot(), l.Token(), l.Deadline().UnixNano())
	for {
		select {
		case <-l.Done():
			fmt.Println("lost")
			os.Exit(3)
		case <-time.After(time.Hour):
		}
	}
}

// child is a test binary re-run as a holder or waiter.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startChild(t *testing.T, v variant, addr, name string, limit int, lease, queue time.Duration) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	fair := "0"
	if v.fair {
		fair = "1"
	}
	cmd.Env = append(os.Environ(), envRole+"=acquire", envAddr+"="+addr, envName+"="+name, envFair+"="+fair,
		envLimit+"="+strconv.Itoa(limit), envLease+"="+strconv.FormatInt(lease.Milliseconds(), 10),
		envQueue+"="+strconv.FormatInt(queue.Milliseconds(), 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, lines: make(chan string, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		ch.kill()
		<-done
		_ = cmd.Wait()
	})
	return ch
}

// expect waits for a line starting with prefix and returns its fields.
func (c *child) expect(t *testing.T, prefix string, within time.Duration) []string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return strings.Fields(line)
			}
			if strings.HasPrefix(line, "error") || line == "lost" {
				t.Fatalf("child: %s", line)
			}
		case <-timeout:
			t.Fatalf("child did not print %q within %v", prefix, within)
		}
	}
}

func (c *child) kill() { _ = c.cmd.Process.Signal(syscall.SIGKILL) }

// Holders and a waiter in child processes are killed with SIGKILL: their
// slots come back once their leases expire (not before), and the dead
// waiter leaves the queue once its session's QueueTTL has passed.
func TestKilledHoldersAndWaiters(t *testing.T) {
	srv := redistest.Shared(t) // started before the leak checks: it outlives this test
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			c := srv.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			const lease, queue = 2 * time.Second, time.Second
			s := v.new(t, c, name, 2, opts{LeaseTTL: lease, QueueTTL: queue, Fallback: 200 * time.Millisecond})

			var holders []*child
			for i := 0; i < 2; i++ {
				h := startChild(t, v, srv.Addr, name, 2, lease, queue)
				h.expect(t, "held", 30*time.Second)
				holders = append(holders, h)
			}
			w := startChild(t, v, srv.Addr, name, 2, lease, queue)
			w.expect(t, "started", 30*time.Second)
			var deadWaiter string
			if v.fair {
				eventually(t, 10*time.Second, "child queued", func() error {
					st, err := s.Status(ctx)
					if err != nil || len(st.Waiters) != 1 {
						return errorf("status %+v, %v", st, err)
					}
					deadWaiter = st.Waiters[0].ID
					return nil
				})
			} else {
				waitBlocked(t, ctx, c, s, false, name)
			}

			for _, h := range append(holders, w) {
				h.kill()
			}
			killed := time.Now()
			st, err := s.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 2 {
				t.Fatalf("dead holders: %+v", st.Holders)
			}
			var last time.Time // when the dead holders' leases end
			for _, h := range st.Holders {
				if h.Deadline.After(last) {
					last = h.Deadline
				}
			}
			// Before the dead holders' leases end, their slots are not free.
			if time.Now().Before(st.Holders[0].Deadline.Add(-100 * time.Millisecond)) {
				if l, err := s.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatalf("TryAcquire right after the kill: %v, %v (want ErrNoSlot)", l, err)
				}
			}

			a := acquireAsync(ctx, s)
			b := acquireAsync(ctx, s)
			la := await(t, a, lease+10*time.Second, "first slot after the kill")
			lb := await(t, b, lease+10*time.Second, "second slot after the kill")
			if got := time.Now(); got.Before(last.Add(-10 * time.Millisecond)) {
				t.Fatalf("both slots back at %v, before the dead leases ended at %v", got, last)
			}
			if la.Slot() == lb.Slot() {
				t.Fatalf("both leases in slot %d", la.Slot())
			}
			if v.fair {
				st, err := s.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, wt := range st.Waiters {
					if wt.ID == deadWaiter {
						t.Fatalf("dead waiter still queued %v after the kill", time.Since(killed))
					}
				}
			}
			for _, l := range []redsem.Lease{la, lb} {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			_ = s.Close()
			expectCleanState(t, c, name, lease+queue+3*time.Second)
		})
	}
}
