package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart rendered as a small standalone SVG. It is hand
// written (about a hundred lines) rather than drawn with a plotting library
// so that the bench tool adds no dependency to the module.
type Chart struct {
	Title, XLabel, YLabel string
	LogX                  bool    // logarithmic x axis (x values must be > 0)
	XMin                  float64 // with LogX: smaller x values are drawn at XMin; 0: none
	YMin, YMax            float64 // fixed y range when YMax > YMin; else from the data
	Series                []Series
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

// SVG renders the chart.
func (c Chart) SVG() string {
	const w, h, left, right, top, bottom = 720.0, 420.0, 70.0, 170.0, 40.0, 55.0
	pw, ph := w-left-right, h-top-bottom
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			x := s.X[i]
			if c.LogX {
				if x <= 0 {
					continue
				}
				x = math.Log10(math.Max(x, c.XMin))
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if c.LogX {
		xmin, xmax = math.Floor(xmin), math.Ceil(xmax)
	}
	if c.YMax > c.YMin {
		ymin, ymax = c.YMin, c.YMax
	} else {
		ymin = math.Min(ymin, 0)
		ymax = niceCeil(ymax)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax = ymin + 1
	}
	if !c.LogX {
		xmin = math.Min(xmin, 0)
		xmax = niceCeil(xmax)
	}
	px := func(x float64) float64 {
		if c.LogX {
			x = math.Log10(math.Max(x, c.XMin))
		}
		return left + (x-xmin)/(xmax-xmin)*pw
	}
	py := func(y float64) float64 { return top + ph - (y-ymin)/(ymax-ymin)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(c.Title))
	// grid and ticks
	for i := 0; i <= 5; i++ {
		y := ymin + (ymax-ymin)*float64(i)/5
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(y), left+pw, py(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py(y)+4, num(y))
	}
	var xt []float64
	if c.LogX {
		for e := xmin; e <= xmax; e++ {
			xt = append(xt, math.Pow(10, e))
		}
	} else {
		for i := 0; i <= 5; i++ {
			xt = append(xt, xmin+(xmax-xmin)*float64(i)/5)
		}
	}
	for _, x := range xt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px(x), top, px(x), top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), top+ph+16, num(x))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+pw/2, h-12, esc(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, esc(c.YLabel))
	// series
	for k, s := range c.Series {
		col := palette[k%len(palette)]
		var pts []string
		for i := range s.X {
			if c.LogX && s.X[i] <= 0 {
				continue
			}
			y := math.Max(math.Min(s.Y[i], ymax), ymin)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[i]), py(y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		if len(s.X) <= 20 {
			for _, p := range pts {
				var x, y float64
				fmt.Sscanf(p, "%f,%f", &x, &y)
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x, y, col)
			}
		}
		ly := top + 10 + float64(k)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", left+pw+12, ly, left+pw+32, ly, col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+38, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// CDF returns the points of the empirical distribution of sorted values,
// thinned to at most n points.
func CDF(sorted []float64, n int) (x, y []float64) {
	if len(sorted) == 0 {
		return nil, nil
	}
	step := max(1, len(sorted)/n)
	for i := 0; i < len(sorted); i += step {
		x = append(x, sorted[i])
		y = append(y, float64(i+1)/float64(len(sorted)))
	}
	x = append(x, sorted[len(sorted)-1])
	y = append(y, 1)
	return x, y
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e6:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 0.1:
		return fmt.Sprintf("%.2g", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func esc(s string) string { return html.EscapeString(s) }
