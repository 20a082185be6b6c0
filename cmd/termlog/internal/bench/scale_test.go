package bench

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestScaleGroupTiny runs the scale group at two tiny sizes on one node:
// every point measures every figure, the table lists the points and the
// plot is well-formed SVG with a line per series.
func TestScaleGroupTiny(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "docs", "scale.svg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Only: []string{GroupScale}, Scale: []int{4, 16}, ScaleReplicas: []int{1},
		HeartbeatFor: time.Second, Lease: time.Second, PhaseTimeout: 30 * time.Second, Plot: plot})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) > 0 || len(rep.Scale) != 2 {
		t.Fatalf("problems %q, %d points", rep.Problems, len(rep.Scale))
	}
	for _, p := range rep.Scale {
		if p.Problem != "" || p.BurstPartial || p.RawBurstPartly {
			t.Errorf("%d workers: problem %q, burst partial %v, raw partial %v", p.Workers, p.Problem, p.BurstPartial, p.RawBurstPartly)
		}
		for name, v := range map[string]float64{"burst": p.BurstS, "raw burst": p.RawBurstS, "failover": p.FailoverS, "raw lease": p.RawLeaseS,
			"heartbeat p99": p.HeartbeatP99, "raw p99": p.RawHeartbeatP99} {
			if !(v > 0) {
				t.Errorf("%d workers: %s = %v, want > 0", p.Workers, name, v)
			}
		}
		if p.FailoverS < p.FailoverRecoveredS-1 || p.Server != "1 node, sync always" {
			t.Errorf("%d workers: failover %v s, recovered %v s, server %q", p.Workers, p.FailoverS, p.FailoverRecoveredS, p.Server)
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "scale (sync always") || strings.Count(table.String(), "\nR1  ") != 2 {
		t.Errorf("table:\n%s", table.String())
	}
	b, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	// CPU and memory per worker are below resolution or noise at these
	// sizes; burst, failover and heartbeat p99 are drawn for both sides.
	if lines := checkSVG(t, b); lines < 6 || lines > 10 {
		t.Errorf("%d polylines, want 6..10 (5 panels x termlog and baseline, R1)", lines)
	}
	for _, name := range []string{"termlog R1", "raw responder R1", "raw KV lease handover R1", "trivial responder R1"} {
		if !bytes.Contains(b, []byte(`data-name="`+name+`"`)) {
			t.Errorf("plot has no line %q", name)
		}
	}
}

// TestScalePlot: the plot of R1 and R3 points is well-formed, has one line
// per series and configuration with a vertex per drawable point, draws a
// bounded point hollow and the target line, and labels its axes.
func TestScalePlot(t *testing.T) {
	rep := &Report{CPUs: 2, Lease: 3, HBFor: 10, Go: "go", GoOS: "linux", GoArch: "amd64"}
	for _, r := range []int{1, 3} {
		for i, n := range []int{1000, 10_000, 30_000, 100_000} {
			f := float64(i + 1)
			rep.Scale = append(rep.Scale, ScalePoint{Replicas: r, Workers: n, BurstS: f, RawBurstS: f / 2, BurstPartial: n == 100_000,
				FailoverS: 3 + f/10, RawLeaseS: 3, HeartbeatP99: f, RawHeartbeatP99: 1, LeaderCores: f / 10, ResponderCores: 0.01,
				HeapPerWorker: 5000, StackPerWorker: 3000, LeaderBPerWorker: 6000})
		}
	}
	b := scalePlot(rep)
	if lines := checkSVG(t, b); lines != 20 {
		t.Errorf("%d polylines, want 20 (5 panels x 2 series x R1, R3)", lines)
	}
	s := string(b)
	for _, want := range []string{`data-name="termlog R3"`, "workers (log scale)", "target: lease + 0.5 s = 3.5 s", ">100k<", ">30k<", `fill="white" stroke="#1f5fbf"`, `stroke-dasharray="7,4"`} {
		if !strings.Contains(s, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
	if got := strings.Count(s, `fill="white" stroke="#1f5fbf"`); got != 2 {
		t.Errorf("%d hollow termlog points, want 2 (the bounded burst at 100k, R1 and R3)", got)
	}

	// --replot: the same plot from the report saved as JSON.
	dir := t.TempDir()
	saved, plot := filepath.Join(dir, "rep.json"), filepath.Join(dir, "plots", "scale.svg")
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saved, js.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Replot(saved, plot); err != nil {
		t.Fatalf("Replot: %v", err)
	}
	if got, err := os.ReadFile(plot); err != nil || !bytes.Equal(got, b) {
		t.Errorf("Replot wrote %d bytes (%v), want the %d-byte plot of the report it was saved from", len(got), err, len(b))
	}
	if err := Replot(plot, filepath.Join(dir, "x.svg")); err == nil || !strings.Contains(err.Error(), "not a bench report") {
		t.Errorf("Replot of an SVG: %v, want 'not a bench report'", err)
	}
}

// checkSVG parses b as XML with an svg root and returns how many
// polylines it has, each with at least one vertex.
func checkSVG(t *testing.T, b []byte) int {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	lines, root := 0, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
		}
		if se.Name.Local == "polyline" {
			lines++
			for _, a := range se.Attr {
				if a.Name.Local == "points" && !strings.Contains(a.Value, ",") {
					t.Errorf("polyline without a vertex: %v", se.Attr)
				}
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return lines
}
