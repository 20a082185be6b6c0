package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The scale group's plot: hand-written SVG (no dependency), one panel per
// figure, worker count on a log axis, one line per series and server
// configuration (R1 solid, R3 dashed), termlog in blue, its raw baseline
// in orange. A point a bound stopped is drawn hollow.

const (
	plotW, plotH     = 1000, 1060
	panelW, panelH   = 500, 330
	marginL, marginR = 70, 25
	marginT, marginB = 50, 55
	colorTermlog     = "#1f5fbf"
	colorRaw         = "#e07b00"
	colorTarget      = "#c0262d"
	colorMemory      = "#2a9d4a"
)

type plotPt struct {
	x, y    float64
	partial bool
}

type plotSeries struct {
	name   string
	color  string
	dashed bool
	pts    []plotPt
}

type plotRef struct {
	y     float64
	label string
}

type plotPanel struct {
	title, ylabel string
	note          string // under the title
	logY          bool
	series        []plotSeries
	refs          []plotRef
}

// writePlotFile writes the scale plot of rep to path (its directory made).
func writePlotFile(path string, rep *Report) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(path, scalePlot(rep), 0o644)
}

// scalePlot renders rep's scale points as SVG.
func scalePlot(rep *Report) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	text(&b, plotW/2, 24, "middle", 17, "bold", fmt.Sprintf("termlog at scale: %s, sync always, %d CPUs, one run", strings.Join(replicaNames(rep), " and "), rep.CPUs))
	for i, p := range scalePanels(rep) {
		drawPanel(&b, float64((i%2)*panelW), float64(40+(i/2)*panelH), p)
	}
	drawLegend(&b, float64(panelW), float64(40+2*panelH), rep)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func replicaNames(rep *Report) []string {
	var out []string
	for _, p := range rep.Scale {
		if s := fmt.Sprintf("R%d", p.Replicas); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// scalePanels builds the five panels from the points.
func scalePanels(rep *Report) []plotPanel {
	pick := func(name, color string, y func(ScalePoint) float64, partial func(ScalePoint) bool) []plotSeries {
		var out []plotSeries
		for _, rn := range replicaNames(rep) {
			s := plotSeries{name: name + " " + rn, color: color, dashed: rn != "R1"}
			for _, p := range rep.Scale {
				if fmt.Sprintf("R%d", p.Replicas) == rn {
					s.pts = append(s.pts, plotPt{x: float64(p.Workers), y: y(p), partial: partial != nil && partial(p)})
				}
			}
			out = append(out, s)
		}
		return out
	}
	none := func(ScalePoint) bool { return false }
	failed := func(p ScalePoint) bool { return p.Problem != "" }
	return []plotPanel{
		{title: "Registration burst: all registered, on 3 replicas", ylabel: "seconds", logY: true, series: slices.Concat(
			pick("termlog", colorTermlog, func(p ScalePoint) float64 { return p.BurstS }, func(p ScalePoint) bool { return p.BurstPartial }),
			pick("raw responder", colorRaw, func(p ScalePoint) float64 { return p.RawBurstS }, func(p ScalePoint) bool { return p.RawBurstPartly }))},
		{title: "Failover: leader killed -> first worker served", ylabel: "seconds", series: slices.Concat(
			pick("termlog", colorTermlog, func(p ScalePoint) float64 { return p.FailoverS }, failed),
			pick("raw KV lease handover", colorRaw, func(p ScalePoint) float64 { return p.RawLeaseS }, none)),
			refs: []plotRef{{y: rep.Lease + 0.5, label: fmt.Sprintf("target: lease + 0.5 s = %.1f s", rep.Lease+0.5)}}},
		{title: "Heartbeat reply p99 at the worker, 1 Hz each", ylabel: "milliseconds", logY: true, series: slices.Concat(
			pick("termlog", colorTermlog, func(p ScalePoint) float64 { return p.HeartbeatP99 }, failed),
			pick("trivial responder", colorRaw, func(p ScalePoint) float64 { return p.RawHeartbeatP99 }, none))},
		{title: "CPU under those heartbeats", ylabel: "% of one core", series: slices.Concat(
			pick("termlog leader", colorTermlog, func(p ScalePoint) float64 { return 100 * p.LeaderCores }, failed),
			pick("trivial responder", colorRaw, func(p ScalePoint) float64 { return 100 * p.ResponderCores }, none))},
		{title: "Memory per worker (heap + stacks)", ylabel: "KiB per worker", series: slices.Concat(
			pick("whole process", colorTermlog, func(p ScalePoint) float64 { return (p.HeapPerWorker + p.StackPerWorker) / 1024 }, failed),
			pick("one leading replica alone", colorMemory, func(p ScalePoint) float64 { return p.LeaderBPerWorker / 1024 }, none)),
			note: "blue: the whole process (3 replicas, N worker clients, server); green: one leader alone"},
	}
}

// axis maps values to pixels, linearly or by log10.
type axis struct {
	lo, hi   float64 // in value space (log10 of it for a log axis)
	log      bool
	pix0, px float64 // pixel of lo, and pixels from lo to hi (may be negative)
}

func (a axis) at(v float64) float64 {
	if a.log {
		v = math.Log10(v)
	}
	return a.pix0 + (v-a.lo)/(a.hi-a.lo)*a.px
}

// drawPanel draws one panel with its top-left corner at (x0, y0).
func drawPanel(b *bytes.Buffer, x0, y0 float64, p plotPanel) {
	left, top := x0+marginL, y0+marginT
	w, h := float64(panelW-marginL-marginR), float64(panelH-marginT-marginB)
	xs, ys := panelValues(p)
	xa := axis{log: true, pix0: left, px: w}
	xa.lo, xa.hi = logRange(xs)
	ya := axis{log: p.logY, pix0: top + h, px: -h}
	if p.logY {
		ya.lo, ya.hi = logRange(ys)
	} else {
		ya.lo, ya.hi = 0, niceMax(slices.Max(append(ys, 0)))
	}
	text(b, x0+panelW/2, y0+20, "middle", 14, "bold", p.title)
	text(b, x0+panelW/2, y0+35, "middle", 11, "", p.note)
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, top, w, h)
	drawXTicks(b, xa, xs, top+h)
	drawYTicks(b, ya, left, left+w)
	text(b, left+w/2, top+h+38, "middle", 12, "", "workers (log scale)")
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n", x0+16, top+h/2, x0+16, top+h/2, esc(p.ylabel))
	for _, r := range p.refs {
		if y := ya.at(r.y); y >= top && y <= top+h {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="2,3"/>`+"\n", left, y, left+w, y, colorTarget)
		}
	}
	for _, s := range p.series {
		drawSeries(b, xa, ya, s)
	}
	// The targets' labels last, with a white halo: readable over the lines.
	for _, r := range p.refs {
		if y := ya.at(r.y); y >= top && y <= top+h {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="11" fill="%s" stroke="white" stroke-width="3" paint-order="stroke">%s</text>`+"\n", left+w-4, y+14, colorTarget, esc(r.label))
		}
	}
}

// panelValues lists the x and the drawable y values of a panel.
func panelValues(p plotPanel) (xs, ys []float64) {
	for _, s := range p.series {
		for _, pt := range s.pts {
			xs = append(xs, pt.x)
			if pt.y > 0 && !math.IsNaN(pt.y) {
				ys = append(ys, pt.y)
			}
		}
	}
	for _, r := range p.refs {
		ys = append(ys, r.y)
	}
	if len(xs) == 0 {
		xs = []float64{1}
	}
	if len(ys) == 0 {
		ys = []float64{1}
	}
	return xs, ys
}

// logRange is the decades (log10) around vs, at least one wide.
func logRange(vs []float64) (float64, float64) {
	lo, hi := math.Floor(math.Log10(slices.Min(vs))), math.Ceil(math.Log10(slices.Max(vs)))
	if hi-lo < 1 {
		hi = lo + 1
	}
	return lo, hi
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten, plus a tenth.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	v *= 1.1
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func drawXTicks(b *bytes.Buffer, a axis, xs []float64, y float64) {
	for d := a.lo; d <= a.hi+1e-9; d++ {
		x := a.at(math.Pow(10, d))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, y, x, y-float64(panelH-marginT-marginB))
	}
	seen := map[float64]bool{}
	for _, v := range xs {
		if seen[v] {
			continue
		}
		seen[v] = true
		x := a.at(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444"/>`+"\n", x, y, x, y+5)
		text(b, x, y+18, "middle", 11, "", countLabel(v))
	}
}

func drawYTicks(b *bytes.Buffer, a axis, x0, x1 float64) {
	var ticks []float64
	if a.log {
		for d := a.lo; d <= a.hi+1e-9; d++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, d); math.Log10(v) <= a.hi+1e-9 {
					ticks = append(ticks, v)
				}
			}
		}
	} else {
		for i := range 6 {
			ticks = append(ticks, a.hi*float64(i)/5)
		}
	}
	for _, v := range ticks {
		y := a.at(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x0, y, x1, y)
		text(b, x0-6, y+4, "end", 11, "", tickLabel(v))
	}
}

func drawSeries(b *bytes.Buffer, xa, ya axis, s plotSeries) {
	dash := ""
	if s.dashed {
		dash = ` stroke-dasharray="7,4"`
	}
	var pts []string
	for _, p := range s.pts {
		if p.y > 0 && !math.IsNaN(p.y) {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xa.at(p.x), ya.at(p.y)))
		}
	}
	if len(pts) == 0 {
		return // nothing measurable (CPU below the profiler's resolution)
	}
	fmt.Fprintf(b, `<polyline class="series" data-name="%s" points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", esc(s.name), strings.Join(pts, " "), s.color, dash)
	for _, p := range s.pts {
		if p.y <= 0 || math.IsNaN(p.y) {
			continue
		}
		fill := s.color
		if p.partial {
			fill = "white"
		}
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s" stroke-width="1.5"/>`+"\n", xa.at(p.x), ya.at(p.y), fill, s.color)
	}
}

// drawLegend fills the sixth panel: the series' key and what was run.
func drawLegend(b *bytes.Buffer, x0, y0 float64, rep *Report) {
	y := y0 + 50
	line := func(color, dash, label string) {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", x0+30, y-4, x0+80, y-4, color, dash)
		text(b, x0+90, y, "start", 12, "", label)
		y += 22
	}
	line(colorTermlog, "", "termlog (client.Worker.Run against 3 meta replicas), R1")
	line(colorTermlog, ` stroke-dasharray="7,4"`, "termlog, R3 (3-node NATS cluster on loopback)")
	line(colorRaw, "", "raw baseline on the same server, R1")
	line(colorRaw, ` stroke-dasharray="7,4"`, "raw baseline, R3")
	line(colorTarget, ` stroke-dasharray="2,3"`, "issue 21 target")
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="white" stroke="#444" stroke-width="1.5"/>`+"\n", x0+55, y-4)
	text(b, x0+90, y, "start", 12, "", "hollow: stopped by the bench's bound (a lower bound)")
	y += 34
	for _, s := range []string{
		fmt.Sprintf("lease %.0f s; heartbeat window %.0f s; one fresh server per point", rep.Lease, rep.HBFor),
		fmt.Sprintf("%s, %s/%s, %d CPUs shared with other jobs", rep.Go, rep.GoOS, rep.GoArch, rep.CPUs),
		"made by: termlog bench --only scale --plot <file>",
	} {
		text(b, x0+30, y, "start", 12, "", s)
		y += 20
	}
}

func countLabel(v float64) string {
	if v >= 1000 && math.Mod(v, 1000) == 0 {
		return fmt.Sprintf("%.0fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100 || v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

func text(b *bytes.Buffer, x, y float64, anchor string, size int, weight, s string) {
	w := ""
	if weight != "" {
		w = fmt.Sprintf(` font-weight="%s"`, weight)
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d"%s>%s</text>`+"\n", x, y, anchor, size, w, esc(s))
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// Replot writes the scale plot of a report saved with --json to plot,
// measuring nothing: a plot can be redrawn without a 30-minute run.
func Replot(report, plot string) error {
	b, err := os.ReadFile(report)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: not a bench report (--json): %w", report, err)
	}
	if len(rep.Scale) == 0 {
		return fmt.Errorf("%s: the report has no scale points (run the scale group with --json)", report)
	}
	return writePlotFile(plot, &rep)
}
