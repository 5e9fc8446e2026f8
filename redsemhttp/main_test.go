package redsemhttp_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemhttp"
)

// childEnv marks this test binary re-executed as a second server process
// (see startChild).
const childEnv = "REDSEMHTTP_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(redistest.MainNoLeaks(m))
}

// newFair returns a fair semaphore (its Status lists the waiters, which the
// tests wait for), closed when the test ends.
func newFair(t *testing.T, client redis.UniversalClient, name string, limit int, opts fair.Options) *fair.Semaphore {
	t.Helper()
	s, err := fair.New(client, name, limit, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// fixed is an Options.Semaphore / Transport.Semaphore that always picks s.
func fixed(s redsem.Semaphore) func(*http.Request) (redsem.Semaphore, error) {
	return func(*http.Request) (redsem.Semaphore, error) { return s, nil }
}

// counts returns the live holders and waiters of s.
func counts(t *testing.T, s redsem.Semaphore) (holders, waiters int) {
	t.Helper()
	st, err := s.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(st.Holders), len(st.Waiters)
}

// wantCounts fails the test unless s has exactly these holders and waiters
// (after an abandoned Acquire, once its undo ran: that runs detached from
// the ended context, so it is waited for).
func wantCounts(t *testing.T, s redsem.Semaphore, holders, waiters int) {
	t.Helper()
	waitCounts(t, s, holders, waiters)
}

// waitCounts polls Status until s has these holders and waiters; it fails
// the test after 10s.
func waitCounts(t *testing.T, s redsem.Semaphore, holders, waiters int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, w := counts(t, s)
		if h == holders && w == waiters {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %d holders, %d waiters; want %d, %d", h, w, holders, waiters)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tracker counts the requests that are inside it at once, over every
// process that calls it: /hold?from=X enters, reports on entered, blocks
// until gate is closed, and leaves.
type tracker struct {
	*httptest.Server
	inflight, max atomic.Int64
	entered       chan string
	gate          chan struct{}
	openGate      sync.Once
	mu            sync.Mutex
	from          map[string]int
}

func newTracker(t *testing.T) *tracker {
	tr := &tracker{entered: make(chan string, 100), gate: make(chan struct{}), from: map[string]int{}}
	tr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := tr.inflight.Add(1)
		for m := tr.max.Load(); n > m && !tr.max.CompareAndSwap(m, n); m = tr.max.Load() {
		}
		from := r.URL.Query().Get("from")
		tr.mu.Lock()
		tr.from[from]++
		tr.mu.Unlock()
		tr.entered <- from
		select {
		case <-tr.gate:
		case <-r.Context().Done():
		}
		tr.inflight.Add(-1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(func() {
		tr.open() // a failed test may leave requests inside
		tr.Close()
	})
	return tr
}

// open lets every request inside the tracker, and every later one, leave.
func (tr *tracker) open() { tr.openGate.Do(func() { close(tr.gate) }) }

// entries returns how many requests entered from each caller.
func (tr *tracker) entries() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	m := make(map[string]int, len(tr.from))
	for k, v := range tr.from {
		m[k] = v
	}
	return m
}

// waitEntered waits for n requests to enter the tracker.
func (tr *tracker) waitEntered(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-tr.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d requests entered within 10s", i, n)
		}
	}
}

// callTracker is a handler that holds its request inside the tracker at
// url (with ?from=).
func callTracker(url string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, url, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		_, _ = io.WriteString(w, "done")
	})
}

// startChild re-executes the test binary as a second server process: it
// serves callTracker(trackerURL?from=child) behind Middleware with a fair
// semaphore of this name and limit, and returns its URL. The child runs
// until the test ends.
func startChild(t *testing.T, redisAddr, name string, limit int, trackerURL string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_ADDR="+redisAddr, "CHILD_NAME="+name,
		"CHILD_LIMIT="+strconv.Itoa(limit), "CHILD_TRACKER="+trackerURL)
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
	t.Cleanup(func() {
		_ = stdin.Close() // the child exits at EOF
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		var url string
		if _, err := fmt.Sscanf(l, "serving %s", &url); !ok || err != nil {
			t.Fatalf("child said %q, want serving URL", l)
		}
		return url
	case <-time.After(10 * time.Second):
		t.Fatal("child did not start within 10s")
	}
	return ""
}

// childMain is the second server process; it exits when stdin closes.
func childMain() int {
	limit, err := strconv.Atoi(os.Getenv("CHILD_LIMIT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("CHILD_ADDR"), ContextTimeoutEnabled: true})
	defer client.Close()
	sem, err := fair.New(client, os.Getenv("CHILD_NAME"), limit, fair.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer sem.Close()
	mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: fixed(sem)})
	// Not closed: Close would wait for requests that a failed test leaves
	// blocked; the process exits instead.
	srv := httptest.NewServer(mw(callTracker(os.Getenv("CHILD_TRACKER") + "/hold?from=child")))
	fmt.Printf("serving %s\n", srv.URL)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}
