package redsem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A lease handed from one OS process to another: the child (this test
// binary run again as TestResumeChild) acquires and keeps its lease
// renewed, the parent resumes it by its id. resumeChildEnv carries the
// child's parameters (JSON); the child prints JSON lines: "acquired" (id,
// token, slots), then, once its lease ended, "ended" (its Err and what its
// Observer and Logger reported).
const resumeChildEnv = "REDSEM_RESUME_CHILD"

type resumeChildParams struct {
	Addr    string `json:"addr"`
	Name    string `json:"name"`
	Variant string `json:"variant"`
	TTLMs   int    `json:"ttl_ms"`
	QueueMs int    `json:"queue_ms"`
}

type resumeChildLine struct {
	Ev       string `json:"ev"`
	ID       string `json:"id,omitempty"`
	Token    int64  `json:"token,omitempty"`
	Slots    []int  `json:"slots,omitempty"`
	Err      string `json:"err,omitempty"`
	Released int    `json:"released"`
	Lost     int    `json:"lost"`
	Warns    int    `json:"warns"`
}

// TestResumeChild is the child of TestResumeAcrossProcesses; it does
// nothing in a normal run.
func TestResumeChild(t *testing.T) {
	raw := os.Getenv(resumeChildEnv)
	if raw == "" {
		t.Skip("run by TestResumeAcrossProcesses only")
	}
	var p resumeChildParams
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer rdb.Close()
	v := variants[0]
	if p.Variant == "fair" {
		v = variants[1]
	}
	evs := &eventLog{}
	ended := make(chan struct{}, 1) // the lease's end was reported (after Done closed)
	observe := func(ev redsem.Event) {
		evs.observe(ev)
		if ev.Kind == redsem.EventReleased || ev.Kind == redsem.EventLeaseLost {
			select {
			case ended <- struct{}{}:
			default:
			}
		}
	}
	logs := &recorder{}
	s := newResumeSem(t, v, rdb, p.Name, 1, resumeOpts{LeaseTTL: time.Duration(p.TTLMs) * time.Millisecond,
		QueueTTL: time.Duration(p.QueueMs) * time.Millisecond, Observer: observe, Logger: slog.New(logs)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	say := func(line resumeChildLine) {
		b, _ := json.Marshal(line)
		_, _ = os.Stdout.Write(append(b, '\n'))
	}
	say(resumeChildLine{Ev: "acquired", ID: l.ID(), Token: l.Token(), Slots: l.Slots()})
	for _, c := range []<-chan struct{}{l.Done(), ended} {
		select {
		case <-c:
		case <-ctx.Done():
			t.Fatal("the lease did not end, or its end was not reported, within a minute")
		}
	}
	end := resumeChildLine{Ev: "ended", Released: evs.count(redsem.EventReleased, l.ID()), Lost: evs.count(redsem.EventLeaseLost, l.ID())}
	if err := l.Err(); err != nil {
		end.Err = err.Error()
	}
	for _, m := range strings.Split(logs.all(), "; ") {
		if strings.HasPrefix(m, "WARN") || strings.HasPrefix(m, "ERROR") {
			end.Warns++
		}
	}
	say(end)
}

// resumeChild is a running child and the lines it printed.
type resumeChild struct {
	cmd   *exec.Cmd
	lines chan resumeChildLine
}

func startResumeChild(t *testing.T, p resumeChildParams) *resumeChild {
	t.Helper()
	raw, _ := json.Marshal(p)
	cmd := exec.Command(os.Args[0], "-test.run=^TestResumeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), resumeChildEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &resumeChild{cmd: cmd, lines: make(chan resumeChildLine, 4)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l resumeChildLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Ev != "" {
				c.lines <- l
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// next returns the child's next line, which must be an ev line.
func (c *resumeChild) next(t *testing.T, ev string, within time.Duration) resumeChildLine {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("the child ended without a %q line", ev)
		}
		if l.Ev != ev {
			t.Fatalf("child line %+v, want %q", l, ev)
		}
		return l
	case <-time.After(within):
		t.Fatalf("no %q line from the child within %v", ev, within)
	}
	return resumeChildLine{}
}

// acquireInChild starts a child that acquires a lease of a new semaphore
// of variant v (limit 1) with lease and queue TTLs ttl and queue, and
// returns the semaphore's name, the child and its "acquired" line.
func acquireInChild(t *testing.T, v variant, ttl, queue time.Duration) (string, *resumeChild, resumeChildLine) {
	t.Helper()
	name := redistest.Name(t)
	child := startResumeChild(t, resumeChildParams{Addr: redistest.SharedAddr(), Name: name, Variant: v.name,
		TTLMs: int(ttl.Milliseconds()), QueueMs: int(queue.Milliseconds())})
	return name, child, child.next(t, "acquired", 30*time.Second)
}

// A lease acquired in one OS process and released in another frees its
// slot at once: a waiter (a third client) is admitted before the deadline
// Redis held for the lease, which its first process kept renewing. That
// process's lease then ends as released, with nothing reported lost and
// nothing logged at Warn. And a lease resumed in another process outlives
// the process that acquired it, killed (SIGKILL): fair or not, it is
// renewed by the resuming process alone and nothing takes its slot.
func TestResumeAcrossProcesses(t *testing.T) {
	if os.Getenv(resumeChildEnv) != "" {
		t.Skip("child")
	}
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	forEach(t, func(t *testing.T, v variant) {
		t.Run("released elsewhere", func(t *testing.T) {
			ctx := redistest.Ctx(t, 60*time.Second)
			const ttl = 3 * time.Second
			name, child, got := acquireInChild(t, v, ttl, 3*time.Second)
			b := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttl})
			c := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: ttl})
			l := handOver(t, ctx, v, b, c, got.ID, got.Token, got.Slots)
			end := child.next(t, "ended", 2*ttl+10*time.Second)
			if end.Err != "" || end.Released != 1 || end.Lost != 0 || end.Warns != 0 {
				t.Errorf("the child's lease ended with %+v, want released quietly (no error, one EventReleased, nothing lost, no Warn)", end)
			}
			if err := child.cmd.Wait(); err != nil {
				t.Errorf("child: %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("first process killed", func(t *testing.T) {
			ctx := redistest.Ctx(t, 60*time.Second)
			const ttl = 500 * time.Millisecond
			name, child, got := acquireInChild(t, v, ttl, 300*time.Millisecond)
			b := newResumeSem(t, v, redistest.Client(t), name, 1, resumeOpts{LeaseTTL: time.Second})
			lb, err := b.Resume(ctx, got.ID)
			if err != nil {
				t.Fatal(err)
			}
			_ = child.cmd.Process.Kill()
			_ = child.cmd.Wait()
			// Past the child's lease TTL and queue session, three times.
			time.Sleep(3 * ttl)
			select {
			case <-lb.Done():
				t.Fatalf("the resumed lease ended after its first process died: %v", lb.Err())
			default:
			}
			st, err := b.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 1 || st.Holders[0].ID != got.ID {
				t.Fatalf("holders %+v, want the resumed lease %s", st.Holders, got.ID)
			}
			if _, err := b.TryAcquire(ctx); !errors.Is(err, redsem.ErrNoSlot) {
				t.Fatalf("TryAcquire while the resumed lease is held: %v, want ErrNoSlot", err)
			}
			if err := lb.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := b.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire after the resumed lease's release: %v", err)
			}
			_ = l.Release(ctx)
		})
	})
}
