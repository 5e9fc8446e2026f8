package redsemprom_test

// Tests of promises that docs/promises.md listed as gaps: each checks one
// promise of the package's docs through Metrics.Observe or
// StatusCollector, on real semaphores of both variants.

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemprom"
	"github.com/redsem/redsem/unfair"
)

var bothVariants = []string{"fair", "unfair"}

// newVariant builds a semaphore of the variant, closed when the test ends.
func newVariant(t *testing.T, variant string, c redis.UniversalClient, name string, limit int, obs redsem.Observer, rate redsem.Rate) redsem.Semaphore {
	t.Helper()
	var s redsem.Semaphore
	var err error
	if variant == "fair" {
		s, err = fair.New(c, name, limit, fair.Options{Observer: obs, Rate: rate})
	} else {
		s, err = unfair.New(c, name, limit, unfair.Options{Observer: obs, Rate: rate})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// series returns every series of the metric as "labels=value" lines,
// sorted.
func (p *probe) series(t *testing.T, metric string) []string {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out = append(out, fmt.Sprintf("%s %v", strings.Join(ls, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

// redsem_eviction_policy_unsafe{name,policy} is 1 once a semaphore found
// that its server's maxmemory-policy may evict its keys (allkeys-*,
// volatile-*), and has no series for a semaphore on a noeviction server.
func TestEvictionPolicyUnsafe(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			srv := redistest.Start(t)
			admin := srv.Client(t)
			p := newProbe(t)
			for _, policy := range []string{"allkeys-lru", "volatile-ttl", "noeviction"} {
				if err := admin.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
					t.Fatal(err)
				}
				name := redistest.Name(t) + "-" + policy
				sem := newVariant(t, variant, srv.Client(t), name, 1, p.m.Observe, redsem.Rate{})
				l, err := sem.Acquire(ctx) // the first acquire reads the policy
				if err != nil {
					t.Fatal(err)
				}
				if got := core.EngineOf(sem).MaxMemoryPolicy(); got != policy { // waits for the read
					t.Fatalf("the semaphore read maxmemory-policy %q, want %q", got, policy)
				}
				got := p.get(t, "redsem_eviction_policy_unsafe", "name", name, "policy", policy)
				if policy == "noeviction" {
					if got != -1 {
						t.Errorf("redsem_eviction_policy_unsafe{policy=%q} = %v, want no series", policy, got)
					}
				} else if got != 1 {
					t.Errorf("redsem_eviction_policy_unsafe{policy=%q} = %v, want 1", policy, got)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// One series per evicting policy's semaphore, none for the other.
			if s := p.series(t, "redsem_eviction_policy_unsafe"); len(s) != 2 {
				t.Errorf("redsem_eviction_policy_unsafe series %v, want 2", s)
			}
		})
	}
}

// A TryAcquire refused with ErrNoSlot (every slot held; or the rate's
// window full, a *RateLimitedError that matches ErrNoSlot) changes no
// redsem_acquire_total series, whether TryAcquire or TryAcquireN.
func TestTryAcquireNoSlotNotCounted(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			p := newProbe(t)
			full := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 1, p.m.Observe, redsem.Rate{})
			l, err := full.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()
			rated := newVariant(t, variant, redistest.Client(t), redistest.Name(t), 5, p.m.Observe, redsem.Rate{Limit: 1, Per: time.Minute})
			r, err := rated.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Release(ctx); err != nil {
				t.Fatal(err)
			}
			before := p.series(t, "redsem_acquire_total")
			if len(before) != 12 { // six results for each semaphore
				t.Fatalf("redsem_acquire_total before: %v, want twelve series", before)
			}
			for _, try := range []func() error{
				func() error { _, err := full.TryAcquire(ctx); return err },
				func() error { _, err := full.TryAcquireN(ctx, 1); return err },
				func() error { _, err := rated.TryAcquire(ctx); return err },
				func() error { _, err := rated.TryAcquireN(ctx, 1); return err },
			} {
				if err := try(); !errors.Is(err, redsem.ErrNoSlot) {
					t.Fatalf("TryAcquire: %v, want ErrNoSlot", err)
				}
			}
			var rl *redsem.RateLimitedError
			if _, err := rated.TryAcquire(ctx); !errors.As(err, &rl) {
				t.Fatalf("TryAcquire under a full window: %v, want a *RateLimitedError", err)
			}
			if after := p.series(t, "redsem_acquire_total"); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Fatalf("redsem_acquire_total changed by refused TryAcquire calls:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// StatusOptions.Timeout bounds each semaphore's read: with a Redis that
// does not answer (a black-holed proxy; the client's reads would wait
// 30 s), a scrape ends within the timeout (300 ms, and the default 2 s),
// reports only redsem_status_up 0 for that semaphore, and the other
// semaphore's series in full.
func TestStatusTimeoutBoundsScrape(t *testing.T) {
	for _, variant := range bothVariants {
		for _, timeout := range []time.Duration{300 * time.Millisecond, 0} {
			t.Run(fmt.Sprintf("%s/Timeout=%v", variant, timeout), func(t *testing.T) {
				ctx := redistest.Ctx(t, 30*time.Second)
				srv := redistest.Shared(t)
				proxy := redistest.StartProxy(t, srv.Addr)
				opt := srv.Options()
				opt.Addr = proxy.Addr
				opt.ReadTimeout, opt.WriteTimeout = 30*time.Second, 30*time.Second
				hung := redis.NewClient(opt)
				t.Cleanup(func() { _ = hung.Close() })
				proxy.SetBlackhole(true)
				slow := newVariant(t, variant, hung, redistest.Name(t)+"-slow", 1, nil, redsem.Rate{})
				healthy := newVariant(t, variant, redistest.Client(t), redistest.Name(t)+"-healthy", 3, nil, redsem.Rate{})
				l, err := healthy.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = l.Release(ctx) }()

				reg := prometheus.NewPedanticRegistry()
				if err := reg.Register(redsemprom.NewStatusCollector(redsemprom.StatusOptions{Timeout: timeout}, slow, healthy)); err != nil {
					t.Fatal(err)
				}
				bound := timeout
				if bound == 0 {
					bound = 2 * time.Second // the documented default
				}
				start := time.Now()
				mfs, err := reg.Gather()
				took := time.Since(start)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("scrape took %v (Timeout %v)", took.Round(time.Millisecond), bound)
				if took > bound+time.Second {
					t.Fatalf("the scrape took %v; each read is bounded by %v", took, bound)
				}
				got := map[string]float64{}
				for _, mf := range mfs {
					for _, m := range mf.GetMetric() {
						var ls []string
						for _, lp := range m.GetLabel() {
							ls = append(ls, lp.GetName()+"="+lp.GetValue())
						}
						got[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetGauge().GetValue()
					}
				}
				owner := "" // the healthy lease's owner, as Status shows it
				if st, err := healthy.Status(ctx); err == nil && len(st.Holders) == 1 {
					owner = st.Holders[0].Owner
				} else {
					t.Fatalf("Status: %+v, %v", st, err)
				}
				want := map[string]float64{
					"redsem_status_up{name=" + slow.Name() + "}":                                 0,
					"redsem_status_up{name=" + healthy.Name() + "}":                              1,
					"redsem_status_holders{name=" + healthy.Name() + "}":                         1,
					"redsem_status_queue_length{name=" + healthy.Name() + "}":                    0,
					"redsem_status_limit{name=" + healthy.Name() + "}":                           3,
					"redsem_status_owner_slots{name=" + healthy.Name() + ",owner=" + owner + "}": 1,
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("scrape:\n got %v\nwant %v", got, want)
				}
			})
		}
	}
}
