// Command benchcurves draws tether's cost curves (make bench-curves) as SVG line plots: one
// plot per data file, every series on a log-scale x axis.
//
// A data file (docs/perf/data/NAME.tsv) holds header lines "# title: …", "# x: …", "# y: …",
// "# note: …" (the machine, the load and the baseline, printed under the plot; repeatable) and
// rows "series<TAB>x<TAB>y". benchcurves FILE... writes each plot beside the data directory's
// parent: docs/perf/data/NAME.tsv → docs/perf/NAME.svg. The output depends only on the data.
package main

import (
	"bufio"
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchcurves docs/perf/data/NAME.tsv ...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := render(path); err != nil {
			fmt.Fprintf(os.Stderr, "benchcurves: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

// plot is one data file.
type plot struct {
	title, x, y string
	notes       []string
	series      map[string][]point
}

type point struct{ x, y float64 }

func render(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	p, err := parse(f)
	if err != nil {
		return err
	}
	out := filepath.Join(filepath.Dir(filepath.Dir(path)), strings.TrimSuffix(filepath.Base(path), ".tsv")+".svg")
	return os.WriteFile(out, []byte(p.svg()), 0o644)
}

func parse(r io.Reader) (*plot, error) {
	p := &plot{series: map[string][]point{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if h, ok := strings.CutPrefix(line, "#"); ok {
			k, v, _ := strings.Cut(strings.TrimSpace(h), ":")
			v = strings.TrimSpace(v)
			switch k {
			case "title":
				p.title = v
			case "x":
				p.x = v
			case "y":
				p.y = v
			case "note":
				p.notes = append(p.notes, v)
			}
			continue
		}
		fs := strings.Split(line, "\t")
		if len(fs) != 3 {
			return nil, fmt.Errorf("line %d: want series<TAB>x<TAB>y, got %q", n, line)
		}
		x, err1 := strconv.ParseFloat(fs[1], 64)
		y, err2 := strconv.ParseFloat(fs[2], 64)
		if err1 != nil || err2 != nil || x <= 0 || y < 0 {
			return nil, fmt.Errorf("line %d: x must be > 0 and y >= 0: %q", n, line)
		}
		p.series[fs[0]] = append(p.series[fs[0]], point{x, y})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(p.series) == 0 {
		return nil, fmt.Errorf("no data rows")
	}
	for _, pts := range p.series {
		slices.SortFunc(pts, func(a, b point) int { return cmp.Compare(a.x, b.x) })
	}
	return p, nil
}

// Layout, in SVG user units.
const (
	width, height = 800.0, 420.0
	left, right   = 80.0, 250.0 // the legend sits in the right margin
	top, bottom   = 40.0, 60.0
)

var colours = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"}

func (p *plot) svg() string {
	names := make([]string, 0, len(p.series))
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for name, pts := range p.series {
		names = append(names, name)
		for _, pt := range pts {
			xmin, xmax, ymax = min(xmin, pt.x), max(xmax, pt.x), max(ymax, pt.y)
		}
	}
	slices.Sort(names)
	var notes []string
	for _, n := range p.notes {
		notes = append(notes, wrap(n, 120)...)
	}
	lx0, lx1 := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
	if lx1 == lx0 {
		lx1++
	}
	ytop := niceCeil(ymax)
	plotH := height - top - bottom - 14*float64(len(notes))
	px := func(x float64) float64 { return left + (math.Log10(x)-lx0)/(lx1-lx0)*(width-left-right) }
	py := func(y float64) float64 { return top + plotH - y/ytop*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(p.title))
	// Axes, grid and ticks.
	fmt.Fprintf(&b, `<g stroke="#ccc">`)
	for e := lx0; e <= lx1; e++ {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, px(math.Pow(10, e)), top, px(math.Pow(10, e)), top+plotH)
	}
	for i := 0; i <= 4; i++ {
		y := ytop * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f"/>`, left, py(y), width-right, py(y))
	}
	fmt.Fprintf(&b, "</g>\n")
	for e := lx0; e <= lx1; e++ {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(math.Pow(10, e)), top+plotH+16, siLabel(math.Pow(10, e)))
	}
	for i := 0; i <= 4; i++ {
		y := ytop * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py(y)+4, siLabel(y))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="middle">%s</text>`+"\n", (left+width-right)/2, top+plotH+34, html.EscapeString(p.x))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+plotH/2, html.EscapeString(p.y))
	// Series and legend.
	for i, name := range names {
		c := colours[i%len(colours)]
		var pts []string
		for _, pt := range p.series[name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(pt.x), py(pt.y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		for _, pt := range p.series[name] {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, px(pt.x), py(pt.y), c)
		}
		ly := top + 10 + 18*float64(i)
		fmt.Fprintf(&b, "\n"+`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="%s" stroke-width="2"/>`, width-right+12, ly, width-right+32, ly, c)
		fmt.Fprintf(&b, `<text x="%g" y="%.1f">%s</text>`+"\n", width-right+38, ly+4, html.EscapeString(name))
	}
	for i, n := range notes {
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" font-size="11" fill="#444">%s</text>`+"\n", left, top+plotH+50+14*float64(i), html.EscapeString(n))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// siLabel prints v with a k/M/G suffix.
func siLabel(v float64) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.f {
			return strconv.FormatFloat(v/u.f, 'g', 3, 64) + u.s
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// wrap breaks s into lines of at most n bytes at spaces (a longer word stays whole).
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > n {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}
