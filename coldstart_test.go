package redsem_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// span is one command a client sent: its name and when it ran.
type span struct {
	name       string
	start, end time.Time
}

// spans is a go-redis hook that records every command of its client.
type spans struct {
	mu  sync.Mutex
	got []span
}

func (s *spans) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *spans) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		s.mu.Lock()
		s.got = append(s.got, span{strings.ToLower(cmd.Name()), start, time.Now()})
		s.mu.Unlock()
		return err
	}
}
func (s *spans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (s *spans) take() []span {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.got
	s.got = nil
	return out
}

// serial counts the round trips a call waited for: the commands on its
// path, one after the other; a command that ran beside another (the
// maxmemory-policy check) is not on the path.
func serial(spans []span) (path []string) {
	var last time.Time // when the last command on the path ended
	for _, s := range spans {
		if s.name != "config" && s.name != "function" && s.name != "hello" && s.name != "client" && s.end.After(last) {
			last = s.end
		}
	}
	for _, s := range spans {
		switch {
		case s.name == "hello" || s.name == "client":
			// a new connection's handshake: any first call dials
		case s.name == "config" && s.start.Before(last):
			// the policy check, beside the call's own requests
		case s.name == "function":
			// the library load, in the background after the first call
		default:
			path = append(path, s.name)
		}
	}
	return path
}

// The first Acquire of a fresh engine costs at most one round trip more
// than a warm one: the server clock read (it maps the deadline to server
// time) and the script sent whole, with the maxmemory-policy check beside
// them rather than in series. (Issue 20: the clock read, EVALSHA, NOSCRIPT
// then EVAL, and the policy check made 4 round trips, so a 50 ms MaxWait
// failed the first request of a fresh process under -race.)
func TestColdStartOneExtraRoundTrip(t *testing.T) {
	forEach(t, func(t *testing.T, v variant) {
		srv := redistest.Start(t) // its script cache is empty
		c := srv.Client(t)
		rec := &spans{}
		c.AddHook(rec)
		ctx := redistest.Ctx(t, 20*time.Second)
		s := mustNew(t, v, c, redistest.Name(t), 2, opts{})
		t.Cleanup(func() { _ = s.Close() })
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := s.TryAcquire(actx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		cold := serial(rec.take())
		actx, cancel = context.WithTimeout(ctx, 5*time.Second)
		l2, err := s.TryAcquire(actx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		warm := serial(rec.take())
		_ = l.Release(ctx)
		_ = l2.Release(ctx)
		if len(warm) != 1 || len(cold) > len(warm)+1 {
			t.Fatalf("first TryAcquire waited for %v, a warm one for %v: want at most one round trip more", cold, warm)
		}
	})
}

// TestMeasureColdStart prints the latency of a fresh engine's first
// TryAcquire (with a deadline, on a client whose connection is up) next to
// a warm one's, p50 and p99 over 300 engines, on a server whose script
// cache is emptied before each first call (a fresh deployment's first
// process), through a proxy that adds 1 ms per request:
// REDSEM_MEASURE=1 go test -run TestMeasureColdStart -v .
func TestMeasureColdStart(t *testing.T) {
	if os.Getenv("REDSEM_MEASURE") == "" {
		t.Skip("a measurement: set REDSEM_MEASURE=1")
	}
	forEach(t, func(t *testing.T, v variant) {
		srv := redistest.Start(t)
		// Through a proxy that holds each request 1 ms: a network's round
		// trip, where loopback's would hide the number of round trips.
		p := redistest.StartProxy(t, srv.Addr)
		p.SetDelay(time.Millisecond, nil)
		c := redis.NewClient(&redis.Options{Addr: p.Addr})
		t.Cleanup(func() { _ = c.Close() })
		ctx := redistest.Ctx(t, 2*time.Minute)
		var cold, warm []time.Duration
		for i := range 300 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			s := mustNew(t, v, c, fmt.Sprint(redistest.Name(t), i), 1, opts{})
			for k, into := range []*[]time.Duration{&cold, &warm} {
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				start := time.Now()
				l, err := s.TryAcquire(actx)
				*into = append(*into, time.Since(start))
				cancel()
				if err != nil {
					t.Fatalf("call %d: %v", k, err)
				}
				_ = l.Release(ctx)
			}
			_ = s.Close()
		}
		pct := func(ds []time.Duration, p float64) time.Duration {
			slices.Sort(ds)
			return ds[int(p*float64(len(ds)-1))]
		}
		t.Logf("%s: first call p50 %v p99 %v; warm call p50 %v p99 %v", v.name,
			pct(cold, 0.5), pct(cold, 0.99), pct(warm, 0.5), pct(warm, 0.99))
	})
}
