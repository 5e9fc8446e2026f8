package fencing_test

// Tests of promises that docs/promises.md listed as gaps for the fencing
// guards, on a real redis-server, for both variants.

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
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/fencing"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// The environment of a test binary re-run as TestPromisePausedHolderRefused's
// holder (pausedHolderChild).
const (
	envPausedChild = "REDSEM_FENCING_PAUSED_CHILD" // "1" in the child
	envPausedAddr  = "REDSEM_FENCING_PAUSED_ADDR"
	envPausedName  = "REDSEM_FENCING_PAUSED_NAME"
	envPausedRes   = "REDSEM_FENCING_PAUSED_RESOURCE"
	envPausedFair  = "REDSEM_FENCING_PAUSED_FAIR"  // "1": fair
	envPausedLease = "REDSEM_FENCING_PAUSED_LEASE" // LeaseTTL in ms
)

// The child runs before the tests (and TestMain) would.
func init() {
	if os.Getenv(envPausedChild) == "1" {
		os.Exit(pausedHolderChild())
	}
}

func newVariantSem(fairVariant bool, c redis.UniversalClient, name string, limit int, lease time.Duration) (redsem.Semaphore, error) {
	if fairVariant {
		return fair.New(c, name, limit, fair.Options{LeaseTTL: lease})
	}
	return unfair.New(c, name, limit, unfair.Options{LeaseTTL: lease})
}

// pausedHolderChild is a holder as a service would write one: it acquires
// (auto-renewed), then writes through a RedisGuard's Set every 20 ms with
// its lease's fence, without looking at the lease, until a write is
// refused. It prints "held SLOT TOKEN", "wrote N" per accepted write,
// "stale N HIGHEST" for the refused one, then "lost" once its lease
// reports the loss.
func pausedHolderChild() int {
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(envPausedAddr)})
	defer c.Close()
	leaseMs, _ := strconv.Atoi(os.Getenv(envPausedLease))
	s, err := newVariantSem(os.Getenv(envPausedFair) == "1", c, os.Getenv(envPausedName), 1, time.Duration(leaseMs)*time.Millisecond)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	g, err := fencing.NewRedisGuard(c, fencing.RedisOptions{})
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	ctx := context.Background()
	l, err := s.Acquire(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	fmt.Println("held", l.Slot(), l.Token())
	res := os.Getenv(envPausedRes)
	key := g.DataKey(res, "value")
	for n := 1; ; n++ {
		err := g.Set(ctx, fencing.Of(res, l), key, "child-"+strconv.Itoa(n), 0)
		var se *fencing.StaleError
		switch {
		case err == nil:
			fmt.Println("wrote", n)
		case errors.As(err, &se):
			fmt.Println("stale", n, se.Highest)
			select {
			case <-l.Done():
				fmt.Println("lost", errors.Is(l.Err(), redsem.ErrLeaseLost))
			case <-time.After(10 * time.Second):
				fmt.Println("error: the lease did not report its loss")
			}
			return 0
		default:
			fmt.Println("error", err)
			return 2
		}
		time.Sleep(20 * time.Millisecond) // the holder's pace of work
	}
}

// TestPromisePausedHolderRefused: a holder in a child process, holding the
// only slot and writing through a RedisGuard, is really paused (SIGSTOP)
// past its lease; the slot's next holder gets the same slot with a greater
// token and writes; woken (SIGCONT), the child writes again with its old
// lease: the guard refuses it (a *StaleError naming the new holder's
// token), and the new holder's value stands (README: "a holder that
// paused past its lease is rejected by the store it writes to").
func TestPromisePausedHolderRefused(t *testing.T) {
	const lease = time.Second
	for _, v := range []string{"fair", "unfair"} {
		t.Run(v, func(t *testing.T) {
			ctx := redistest.Ctx(t, 60*time.Second)
			srv := redistest.Shared(t)
			c := redistest.Client(t)
			name := redistest.Name(t)
			res := "resource-" + name
			g := newRedisGuard(t, fencing.RedisOptions{})
			key := g.DataKey(res, "value")
			s, err := newVariantSem(v == "fair", c, name, 1, lease)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			fairEnv := "0"
			if v == "fair" {
				fairEnv = "1"
			}
			cmd.Env = append(os.Environ(), envPausedChild+"=1", envPausedAddr+"="+srv.Addr, envPausedName+"="+name,
				envPausedRes+"="+res, envPausedFair+"="+fairEnv, envPausedLease+"="+strconv.FormatInt(lease.Milliseconds(), 10))
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := make(chan string, 1024)
			readDone := make(chan struct{})
			go func() {
				defer close(readDone)
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				_, _ = io.Copy(io.Discard, out)
			}()
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGCONT)
				_ = cmd.Process.Kill()
				<-readDone
				_ = cmd.Wait()
			})
			// expect returns the fields of the child's next line starting
			// with prefix, failing on an error line.
			expect := func(prefix string, within time.Duration) []string {
				t.Helper()
				timeout := time.After(within)
				for {
					select {
					case line, ok := <-lines:
						if !ok {
							t.Fatalf("the child exited before printing %q", prefix)
						}
						if strings.HasPrefix(line, "error") {
							t.Fatalf("child: %s", line)
						}
						if strings.HasPrefix(line, prefix) {
							return strings.Fields(line)
						}
					case <-timeout:
						t.Fatalf("the child did not print %q within %v", prefix, within)
					}
				}
			}

			f := expect("held", 30*time.Second)
			slot, _ := strconv.Atoi(f[1])
			token, _ := strconv.ParseInt(f[2], 10, 64)
			expect("wrote", 10*time.Second) // it works under its lease
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// The next holder is admitted once the paused child's lease
			// expired, to its slot with a greater token, and writes.
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()
			if l.Slot() != slot || l.Token() <= token {
				t.Fatalf("new holder: slot %d token %d; the paused child had slot %d token %d", l.Slot(), l.Token(), slot, token)
			}
			if err := g.Set(ctx, fencing.Of(res, l), key, "new holder", 0); err != nil {
				t.Fatalf("the new holder's write: %v", err)
			}
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			// Woken, the child writes with its old lease: refused.
			f = expect("stale", 20*time.Second)
			if highest, _ := strconv.ParseInt(f[2], 10, 64); highest != l.Token() {
				t.Errorf("the child's write was refused naming token %d, want the new holder's %d", highest, l.Token())
			}
			if got, err := c.Get(ctx, key).Result(); err != nil || got != "new holder" {
				t.Fatalf("stored %q (%v) after the paused child woke and wrote; want the new holder's value", got, err)
			}
			if f := expect("lost", 20*time.Second); f[1] != "true" {
				t.Errorf("the child's lease ended with an error other than ErrLeaseLost")
			}
		})
	}
}
