package redsemotel_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemotel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestDrawTrace draws the spans of a real run as an SVG timeline: 6
// workers, each a "job" span, share a fair semaphore of limit 2; each job
// acquires (redsem.acquire, its wait), holds for 30-60 ms (redsem.hold),
// releases. REDSEM_DRAW=docs/otel-trace.svg go test ./redsemotel -run
// TestDrawTrace writes the picture the README shows.
func TestDrawTrace(t *testing.T) {
	out := os.Getenv("REDSEM_DRAW")
	if out == "" {
		t.Skip("draws a picture: REDSEM_DRAW=path runs it")
	}
	base, err := fair.New(redistest.Client(t), redistest.Name(t), 2, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	sem := redsemotel.Wrap(base, redsemotel.WithTracerProvider(tp))
	defer sem.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(w) * 5 * time.Millisecond)
			jctx, job := tp.Tracer("app").Start(ctx, fmt.Sprintf("job %d", w+1))
			defer job.End()
			l, err := sem.Acquire(jctx)
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Duration(30+6*w) * time.Millisecond)
			_ = l.Release(jctx)
		}()
	}
	wg.Wait()

	type row struct {
		name               string
		job, acquire, hold sdktrace.ReadOnlySpan
	}
	rows := map[string]*row{}
	byID := map[string]*row{}
	for _, s := range spans.Ended() {
		if strings.HasPrefix(s.Name(), "job ") {
			r := &row{name: s.Name(), job: s}
			rows[s.Name()] = r
			byID[s.SpanContext().SpanID().String()] = r
		}
	}
	for _, s := range spans.Ended() {
		r := byID[s.Parent().SpanID().String()]
		if r == nil {
			continue
		}
		switch s.Name() {
		case "redsem.acquire":
			r.acquire = s
		case "redsem.hold":
			r.hold = s
		}
	}
	var list []*row
	var t0, t1 time.Time
	for _, r := range rows {
		if r.acquire == nil || r.hold == nil {
			t.Fatalf("%s: spans missing", r.name)
		}
		list = append(list, r)
		if t0.IsZero() || r.job.StartTime().Before(t0) {
			t0 = r.job.StartTime()
		}
		if r.job.EndTime().After(t1) {
			t1 = r.job.EndTime()
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].name < list[j].name })
	const left, width, rowH = 90, 560, 34
	scale := float64(width) / float64(t1.Sub(t0))
	x := func(at time.Time) float64 { return left + float64(at.Sub(t0))*scale }
	var b strings.Builder
	h := 60 + rowH*len(list) + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+20, h)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">redsemotel spans of a real run: 6 jobs, a fair semaphore of limit 2 (%d ms)</text>`+"\n", t1.Sub(t0).Milliseconds())
	for i, r := range list {
		y := 40 + i*rowH
		fmt.Fprintf(&b, `<text x="10" y="%d">%s</text>`+"\n", y+18, r.name)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="8" fill="#ddd"/>`+"\n", x(r.job.StartTime()), y+2, x(r.job.EndTime())-x(r.job.StartTime()))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="14" fill="#e8a33d"><title>redsem.acquire %d ms</title></rect>`+"\n",
			x(r.acquire.StartTime()), y+12, max(x(r.acquire.EndTime())-x(r.acquire.StartTime()), 1), r.acquire.EndTime().Sub(r.acquire.StartTime()).Milliseconds())
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="14" fill="#3d7be8"><title>redsem.hold %d ms</title></rect>`+"\n",
			x(r.hold.StartTime()), y+12, x(r.hold.EndTime())-x(r.hold.StartTime()), r.hold.EndTime().Sub(r.hold.StartTime()).Milliseconds())
	}
	ly := 40 + rowH*len(list) + 16
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="8" fill="#ddd"/><text x="%d" y="%d">job (the caller's span)</text>`+"\n", left, ly-8, left+16, ly)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="8" fill="#e8a33d"/><text x="%d" y="%d">redsem.acquire (waiting)</text>`+"\n", left+170, ly-8, left+186, ly)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="8" fill="#3d7be8"/><text x="%d" y="%d">redsem.hold (holding a slot)</text>`+"\n", left+340, ly-8, left+356, ly)
	b.WriteString("</svg>\n")
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
