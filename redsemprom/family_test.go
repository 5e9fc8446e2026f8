package redsemprom_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemprom"
	"github.com/redsem/redsem/unfair"
)

// A family's members are counted under the family's name: three keys make
// one series per metric and result, and no key is ever a label value, as
// with redsemotel.WrapFamily. (Issue 44: each member was its own name
// series, so a family of 10 000 tenants made 10 000.)
func TestFamilyMembersCountedUnderFamilyName(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			p := newProbe(t)
			var get func(key string) (redsem.Semaphore, error)
			if variant == "fair" {
				f, err := fair.NewFamily(redistest.Client(t), name, 1, fair.FamilyOptions{Options: fair.Options{Observer: p.m.Observe}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				get = func(key string) (redsem.Semaphore, error) { return f.Get(key) }
			} else {
				f, err := unfair.NewFamily(redistest.Client(t), name, 1, unfair.FamilyOptions{Options: unfair.Options{Observer: p.m.Observe}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				get = func(key string) (redsem.Semaphore, error) { return f.Get(key) }
			}
			keys := []string{"tenant-a", "tenant-b", "tenant-c"}
			var leases []redsem.Lease
			for _, k := range keys {
				m, err := get(k)
				if err != nil {
					t.Fatal(err)
				}
				l, err := m.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, l)
			}
			m, _ := get(keys[0])
			tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			if _, err := m.Acquire(tctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire of a full member: %v, want a timeout", err)
			}
			cancel()
			if got := p.get(t, "redsem_acquire_total", "name", name, "result", "ok"); got != 3 {
				t.Errorf("acquire_total{name=%q,result=ok} = %v, want 3 (one per member)", name, got)
			}
			if got := p.get(t, "redsem_acquire_total", "name", name, "result", "timeout"); got != 1 {
				t.Errorf("acquire_total{name=%q,result=timeout} = %v, want 1", name, got)
			}
			if got := p.get(t, "redsem_holders", "name", name); got != 3 {
				t.Errorf("holders{name=%q} = %v, want 3", name, got)
			}
			if got := count(t, p.reg, "redsem_wait_seconds", name); got != 3 {
				t.Errorf("wait_seconds{name=%q} count %d, want 3", name, got)
			}
			for _, l := range leases {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := count(t, p.reg, "redsem_hold_seconds", name); got != 3 {
				t.Errorf("hold_seconds{name=%q} count %d, want 3", name, got)
			}
			mfs, err := p.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				for _, s := range mf.GetMetric() {
					for _, l := range s.GetLabel() {
						if l.GetName() == "name" && l.GetValue() != name {
							t.Errorf("%s has a series named %q: a member's key is never a label", mf.GetName(), l.GetValue())
						}
					}
				}
			}
		})
	}
}

// An Acquire whose context was cancelled (the caller gave up) counts as
// canceled, not as a timeout; one whose deadline passed, as a timeout.
// (Issue 44: a cancelled acquire was counted as result="timeout".)
func TestCanceledApartFromTimeout(t *testing.T) {
	for _, variant := range bothVariants {
		t.Run(variant, func(t *testing.T) {
			ctx := redistest.Ctx(t, 30*time.Second)
			name := redistest.Name(t)
			p := newProbe(t)
			s := newVariant(t, variant, redistest.Client(t), name, 1, p.m.Observe, redsem.Rate{})
			l, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(50*time.Millisecond, cancel)
			if _, err := s.Acquire(cctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("Acquire with a cancelled context: %v, want context.Canceled", err)
			}
			tctx, tcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err = s.Acquire(tctx)
			tcancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire past its deadline: %v, want context.DeadlineExceeded", err)
			}
			acq := func(result string) float64 { return p.get(t, "redsem_acquire_total", "name", name, "result", result) }
			if acq("canceled") != 1 || acq("timeout") != 1 {
				t.Errorf("canceled %v, timeout %v; want 1 and 1", acq("canceled"), acq("timeout"))
			}
		})
	}
}

// The package doc, the metric's help, the Result constants and
// docs/operations.md's table list the same results of
// redsem_acquire_total. (Issue 44: the doc listed "ok, timeout, error or
// mismatch", the help also "unavailable".)
func TestAcquireResultsAgree(t *testing.T) {
	consts := []string{redsemprom.ResultOK, redsemprom.ResultTimeout, redsemprom.ResultCanceled,
		redsemprom.ResultUnavailable, redsemprom.ResultError, redsemprom.ResultMismatch}
	slices.Sort(consts)
	words := func(s string) []string {
		out := regexp.MustCompile("[a-z]+").FindAllString(strings.ReplaceAll(s, " or ", ", "), -1)
		slices.Sort(out)
		return out
	}

	p := newProbe(t)
	p.m.Observe(redsem.Event{Kind: redsem.EventAcquired, Name: "x"})
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var help string
	var series []string
	for _, mf := range mfs {
		if mf.GetName() != "redsem_acquire_total" {
			continue
		}
		help = mf.GetHelp()
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					series = append(series, l.GetValue())
				}
			}
		}
	}
	slices.Sort(series)
	if !slices.Equal(series, consts) {
		t.Errorf("series at zero have results %v, want %v", series, consts)
	}
	_, list, ok := strings.Cut(help, "by result: ")
	if got := words(strings.TrimSuffix(list, ".")); !ok || !slices.Equal(got, consts) {
		t.Errorf("help %q lists %v, want %v", help, got, consts)
	}

	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`redsem_acquire_total\{name,result\} +counter: result is ([a-z, ]+)\n`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("doc.go lists no results of redsem_acquire_total")
	}
	if got := words(string(m[1])); !slices.Equal(got, consts) {
		t.Errorf("doc.go lists %v, want %v", got, consts)
	}

	ops, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `redsem_acquire_total\\{name,result\\}` \\|.*$").Find(ops)
	if row == nil {
		t.Fatal("docs/operations.md has no row for redsem_acquire_total")
	}
	var inRow []string
	for _, c := range consts {
		if strings.Contains(string(row), "`"+c+"`") {
			inRow = append(inRow, c)
		}
	}
	if !slices.Equal(inRow, consts) {
		t.Errorf("docs/operations.md's row names %v, want %v", inRow, consts)
	}
}
