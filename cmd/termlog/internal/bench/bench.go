// Package bench measures termlog's hot paths next to raw baselines on one
// embedded NATS JetStream server, in one process and one run: fold rate,
// replay rate from the stream, fenced appends, the cost of syncing before
// every acknowledgement, a registration burst, heartbeat load, failover and
// memory per worker.
//
// Every figure carries its baseline (the same work done the plainest way on
// the same server and the same bytes) and a ratio, the cost of termlog
// relative to the baseline: baseline rate / rate for throughputs, and
// value / baseline for times, latencies, CPU and bytes. 1.0 is "as cheap as
// raw", 2.0 "twice the cost". Every load is bounded in count and in time.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/termlog/termlog/natsserver"
)

// Figure groups, in run order. --only takes these names (or a figure name,
// which selects its group).
const (
	GroupFold      = "fold"
	GroupReplay    = "replay"
	GroupCatchUp   = "catchup"
	GroupAppend    = "append"
	GroupSync      = "sync"
	GroupRegister  = "register"
	GroupHeartbeat = "heartbeat"
	GroupFailover  = "failover"
	GroupMemory    = "memory"
	GroupNodeLoss  = "nodeloss" // only when --only names it (about 15 minutes)
	GroupScale     = "scale"    // only when --only names it (scale.go)
)

// Groups lists every figure group in run order.
func Groups() []string {
	return []string{GroupFold, GroupReplay, GroupCatchUp, GroupAppend, GroupSync, GroupRegister, GroupHeartbeat, GroupFailover, GroupMemory, GroupNodeLoss, GroupScale}
}

// Config sizes a run. Zero fields take the defaults (Defaults).
type Config struct {
	Workers int // registration burst, heartbeat load, failover and memory
	Events  int // fold and replay stream length
	// Appends bounds each append series (fenced, raw sync, raw async);
	// default min(Events, 10000).
	Appends int
	// GroupedAppends is the size of the sync group's grouped series and of
	// its raw atomic-batch baseline (default syncGroupedMin, 100000: their
	// ratio is steady only at that size).
	GroupedAppends int
	// HeartbeatFor is the heartbeat measuring window (default 10s), once for
	// the leader and once for the baseline responder.
	HeartbeatFor time.Duration
	// Lease is the meta lease (default 3s, the failover target's lease).
	Lease time.Duration
	// BurstTimeout bounds the registration burst (default 1m); a burst cut
	// short reports how far it got.
	BurstTimeout time.Duration
	// PhaseTimeout bounds each other phase that waits on the cluster or
	// the stream (default 5m);
	// a phase that runs out reports what it reached and marks the figure.
	PhaseTimeout time.Duration
	// Sync is the sync policy of the server every group but sync runs on
	// (its zero value is natsserver.SyncAlways; Defaults, what termlog bench
	// starts from, has natsserver.SyncInterval). Their baselines are raw JetStream on
	// the same server: with natsserver.SyncAlways an fsync per message
	// dominates both sides (and the raw responder of the register baseline
	// falls behind its workers' retries), so the ratios say less about
	// termlog's own cost. The sync group measures what SyncAlways, the
	// default of termlog's servers, costs.
	Sync natsserver.SyncPolicy
	// Replicas is 1 (one embedded server, the default) or 3: every group
	// runs on an embedded 3-node cluster on loopback, termlog's streams and
	// buckets and the raw baselines' at 3 replicas.
	Replicas int
	// Only restricts the run to these groups (empty: all).
	Only []string
	// Progress receives one line per step (nil: discarded).
	Progress io.Writer
	// Dir holds the server's data; empty makes a temporary one that is
	// removed afterwards.
	Dir string
	// ProfileDir, when set, receives a CPU profile of each measured phase
	// (<figure>.pprof), for go tool pprof.
	ProfileDir string
	// NodeLoss sizes the nodeloss group (nodeloss.go).
	NodeLoss NodeLossConfig
	// Scale is the scale group's worker counts (default DefaultScale), each
	// run on each of ScaleReplicas (default 1 and 3), on --sync always.
	Scale         []int
	ScaleReplicas []int
	// Plot, when set, is where the scale group writes its SVG plot.
	Plot string
}

// Defaults are the sizes of a run without flags: about a minute on 2 cores.
var Defaults = Config{Workers: 1000, Events: 100_000, HeartbeatFor: 10 * time.Second, Lease: 3 * time.Second, PhaseTimeout: 5 * time.Minute, BurstTimeout: time.Minute,
	Sync: natsserver.SyncInterval}

// Target is what the issue asks of a figure.
type Target struct {
	Of    string  `json:"of"` // "value" or "ratio"
	Op    string  `json:"op"` // ">=" or "<="
	Limit float64 `json:"limit"`
	Text  string  `json:"text"`
}

func (t Target) met(f Figure) bool {
	x := f.Value
	if t.Of == "ratio" {
		x = f.Ratio
	}
	if math.IsNaN(x) {
		return false
	}
	if t.Op == ">=" {
		return x >= t.Limit
	}
	return x <= t.Limit
}

// Figure is one measured number with its baseline.
type Figure struct {
	Name         string             `json:"name"`  // group.figure
	What         string             `json:"what"`  // what was measured
	Unit         string             `json:"unit"`  // of Value and Baseline
	Value        float64            `json:"value"` // termlog
	Baseline     float64            `json:"baseline"`
	BaselineWhat string             `json:"baseline_what"`
	Ratio        float64            `json:"ratio"` // cost relative to the baseline
	Higher       bool               `json:"higher_is_better"`
	Target       *Target            `json:"target,omitempty"`
	Met          *bool              `json:"met,omitempty"`
	Partial      bool               `json:"partial,omitempty"` // a bound stopped the load before it finished
	Note         string             `json:"note,omitempty"`
	Extra        map[string]float64 `json:"extra,omitempty"`
	// Server is the server configuration the figure and its baseline ran
	// on (nodes, replicas, sync policy); "" for figures without a server.
	Server string `json:"server,omitempty"`
}

func (f *Figure) finish() {
	switch {
	case f.Higher && f.Value > 0:
		f.Ratio = f.Baseline / f.Value
	case !f.Higher && f.Baseline > 0:
		f.Ratio = f.Value / f.Baseline
	default:
		f.Ratio = math.NaN()
	}
	if f.Target != nil {
		m := f.Target.met(*f) && !f.Partial
		f.Met = &m
	}
}

// Report is the result of a run.
type Report struct {
	Version  int       `json:"version"`
	Started  time.Time `json:"started"`
	Took     float64   `json:"took_s"`
	GoOS     string    `json:"goos"`
	GoArch   string    `json:"goarch"`
	Go       string    `json:"go"`
	CPUs     int       `json:"cpus"`
	Workers  int       `json:"workers"`
	Events   int       `json:"events"`
	Appends  int       `json:"appends"`
	HBFor    float64   `json:"heartbeat_for_s"`
	Lease    float64   `json:"lease_s"`
	Sync     string    `json:"sync"`     // of the server every group but sync runs on
	Replicas int       `json:"replicas"` // of every server configuration of the run
	Figures  []Figure  `json:"figures"`
	Problems []string  `json:"problems,omitempty"` // groups that could not run
	// Scale is the scale group's points, in run order.
	Scale []ScalePoint `json:"scale,omitempty"`
}

// MarshalJSON writes NaN ratios as null.
func (f Figure) MarshalJSON() ([]byte, error) {
	type plain Figure
	p := plain(f)
	var ratio *float64
	if !math.IsNaN(f.Ratio) && !math.IsInf(f.Ratio, 0) {
		ratio = &p.Ratio
	}
	return json.Marshal(struct {
		plain
		Ratio *float64 `json:"ratio"`
	}{p, ratio})
}

func (c Config) withDefaults() (Config, error) {
	d := Defaults
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.Events == 0 {
		c.Events = d.Events
	}
	if c.Appends == 0 {
		c.Appends = min(c.Events, 10_000)
	}
	if c.GroupedAppends == 0 {
		c.GroupedAppends = max(c.Appends, syncGroupedMin)
	}
	if c.HeartbeatFor == 0 {
		c.HeartbeatFor = d.HeartbeatFor
	}
	if c.Lease == 0 {
		c.Lease = d.Lease
	}
	if c.PhaseTimeout == 0 {
		c.PhaseTimeout = d.PhaseTimeout
	}
	if c.BurstTimeout == 0 {
		c.BurstTimeout = d.BurstTimeout
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c, err := c.scaleDefaults(); err != nil {
		return c, err
	}
	switch {
	case c.Workers < 1 || c.Workers > 100_000:
		return c, fmt.Errorf("workers %d: want 1..100000", c.Workers)
	case c.Events < 100 || c.Events > 10_000_000:
		return c, fmt.Errorf("events %d: want 100..10000000", c.Events)
	case c.Appends < 1 || c.Appends > 1_000_000:
		return c, fmt.Errorf("appends %d: want 1..1000000", c.Appends)
	case c.GroupedAppends < 1 || c.GroupedAppends > 1_000_000:
		return c, fmt.Errorf("grouped appends %d: want 1..1000000", c.GroupedAppends)
	case c.HeartbeatFor < time.Second || c.HeartbeatFor > 10*time.Minute:
		return c, fmt.Errorf("heartbeat window %s: want 1s..10m", c.HeartbeatFor)
	case c.PhaseTimeout < time.Second || c.BurstTimeout < time.Second:
		return c, fmt.Errorf("phase timeout %s, burst timeout %s: want >= 1s", c.PhaseTimeout, c.BurstTimeout)
	case c.Lease < 500*time.Millisecond || c.Lease > time.Minute:
		return c, fmt.Errorf("lease %s: want 500ms..1m", c.Lease)
	case c.Replicas != 1 && c.Replicas != 3:
		return c, fmt.Errorf("replicas %d: want 1 or 3", c.Replicas)
	}
	for _, g := range c.Only {
		if groupOf(g) == "" {
			return c, fmt.Errorf("--only %q: want one of %s", g, strings.Join(Groups(), ", "))
		}
	}
	return c, nil
}

// scaleDefaults fills in and checks the scale group's sizes.
func (c *Config) scaleDefaults() (Config, error) {
	if len(c.Scale) == 0 {
		c.Scale = DefaultScale
	}
	if len(c.ScaleReplicas) == 0 {
		c.ScaleReplicas = []int{1, 3}
	}
	for _, n := range c.Scale {
		if n < 1 || n > 100_000 {
			return *c, fmt.Errorf("scale %d: want 1..100000 workers", n)
		}
	}
	for _, r := range c.ScaleReplicas {
		if r != 1 && r != 3 {
			return *c, fmt.Errorf("scale replicas %d: want 1 or 3", r)
		}
	}
	return *c, nil
}

func groupOf(name string) string {
	g, _, _ := strings.Cut(name, ".")
	if slices.Contains(Groups(), g) {
		return g
	}
	return ""
}

func (c Config) wants(group string) bool {
	if len(c.Only) == 0 {
		return true
	}
	for _, o := range c.Only {
		if groupOf(o) == group {
			return true
		}
	}
	return false
}

// run is one run's shared context.
type run struct {
	cfg Config
	dir string
	env *env      // the embedded server, started on first use
	wl  *workload // the fold and replay workload, made on first use
	// replayFilled: the replay stream holds the workload.
	replayFilled bool
	rep          *Report
}

// profile runs f, writing a CPU profile of it to ProfileDir/name.pprof when
// ProfileDir is set.
func (r *run) profile(name string, f func()) {
	if r.cfg.ProfileDir == "" {
		f()
		return
	}
	path := filepath.Join(r.cfg.ProfileDir, name+".pprof")
	out, err := os.Create(path)
	if err != nil {
		r.progress("profile %s: %v", name, err)
		f()
		return
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		r.progress("profile %s: %v", name, err)
		f()
		return
	}
	f()
	pprof.StopCPUProfile()
	r.progress("CPU profile of %s in %s", name, path)
}

// saveProfile writes a profile taken by measureCPU to ProfileDir.
func (r *run) saveProfile(name string, b []byte) {
	if r.cfg.ProfileDir == "" || len(b) == 0 {
		return
	}
	path := filepath.Join(r.cfg.ProfileDir, name+".pprof")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		r.progress("profile %s: %v", name, err)
		return
	}
	r.progress("CPU profile of %s in %s", name, path)
}

// server starts the embedded server on first use.
func (r *run) server() (*env, error) {
	if r.env == nil {
		e, err := startEnvSync(r.dir, r.cfg.Sync, r.cfg.Replicas)
		if err != nil {
			return nil, err
		}
		r.progress("NATS JetStream at %s (%s)", e.url(), e.what())
		r.env = e
	}
	return r.env, nil
}

func (r *run) progress(format string, a ...any) {
	fmt.Fprintf(r.cfg.Progress, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func (r *run) add(f Figure) {
	if f.Server == "" && r.env != nil && groupOf(f.Name) != GroupFold && groupOf(f.Name) != GroupMemory {
		f.Server = r.env.what()
	}
	f.finish()
	r.rep.Figures = append(r.rep.Figures, f)
	r.progress("%s: %s", f.Name, oneLine(f))
}

// Run measures every selected group and returns the report. A group that
// fails (the server not starting included) is recorded in Report.Problems
// and the others still run; Run returns an error only for a bad Config or
// ctx ending.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &Report{Version: 1, Started: start.UTC(), GoOS: runtime.GOOS, GoArch: runtime.GOARCH, Go: runtime.Version(), CPUs: runtime.NumCPU(),
		Workers: cfg.Workers, Events: cfg.Events, Appends: cfg.Appends, HBFor: cfg.HeartbeatFor.Seconds(), Lease: cfg.Lease.Seconds(), Sync: cfg.Sync.String(), Replicas: cfg.Replicas}
	r := &run{cfg: cfg, rep: rep}
	dir := cfg.Dir
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "termlog-bench-*"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	r.progress("workers %d, events %d, appends %d, heartbeat window %s, lease %s, %d CPUs, data in %s",
		cfg.Workers, cfg.Events, cfg.Appends, cfg.HeartbeatFor, cfg.Lease, runtime.NumCPU(), dir)
	r.dir = dir
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if r.env != nil {
			r.env.close()
		}
	}()

	// Memory first: it needs no server, so nothing else runs while it
	// measures the live heap.
	steps := []struct {
		group string
		fn    func(context.Context) error
	}{
		{GroupMemory, r.memory},
		{GroupFold, r.fold},
		{GroupReplay, r.replay},
		{GroupCatchUp, r.catchUp},
		{GroupAppend, r.appends},
		{GroupSync, r.syncCost},
		{GroupRegister + "+", r.cluster}, // register, heartbeat and failover share one cluster
		{GroupNodeLoss, r.nodeLoss},
		{GroupScale, r.scale},
	}
	for _, s := range steps {
		want := r.cfg.wants(s.group)
		if s.group == GroupRegister+"+" {
			want = r.cfg.wants(GroupRegister) || r.cfg.wants(GroupHeartbeat) || r.cfg.wants(GroupFailover)
		}
		if s.group == GroupNodeLoss || s.group == GroupScale {
			want = r.cfg.named(s.group)
		}
		if !want {
			continue
		}
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			msg := fmt.Sprintf("%s: %v", strings.TrimSuffix(s.group, "+"), err)
			rep.Problems = append(rep.Problems, msg)
			r.progress("FAILED %s", msg)
		}
	}
	rep.Took = time.Since(start).Seconds()
	r.progress("done in %s", time.Since(start).Round(time.Millisecond))
	return rep, nil
}

// WriteJSON writes the report as indented JSON. A figure not measured
// may be NaN (a percentile of no samples, a ratio to nothing), which JSON
// cannot hold: it is written as 0, "not measured" as the tables print it
// ("-"), and ratios as null.
func (rep *Report) WriteJSON(w io.Writer) error {
	out := *rep
	out.Figures = slices.Clone(rep.Figures)
	for i := range out.Figures {
		f := &out.Figures[i]
		f.Value, f.Baseline = finite(f.Value), finite(f.Baseline)
		if f.Extra != nil {
			extra := make(map[string]float64, len(f.Extra))
			for k, v := range f.Extra {
				extra[k] = finite(v)
			}
			f.Extra = extra
		}
	}
	out.Scale = slices.Clone(rep.Scale)
	for i := range out.Scale {
		out.Scale[i].finite()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(&out)
}

// finite is v, or 0 when it is NaN or infinite.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// WriteTable writes the report as a table for people.
func (rep *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "termlog bench: %d workers, %d events, %d appends, %s/%s %d CPUs, %s, took %.1fs; server sync %s, replicas %d (the sync group: always vs interval)\n",
		rep.Workers, rep.Events, rep.Appends, rep.GoOS, rep.GoArch, rep.CPUs, rep.Go, rep.Took, rep.Sync, rep.Replicas)
	fmt.Fprintln(w, "ratio = cost relative to the baseline (1.00 = as cheap as raw, 2.00 = twice the cost)")
	if err := rep.writeFigures(w); err != nil {
		return err
	}
	if len(rep.Scale) > 0 {
		if err := rep.writeScaleTable(w); err != nil {
			return err
		}
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM %s\n", p)
	}
	return nil
}

// writeFigures writes the figures' table and what each measured.
func (rep *Report) writeFigures(w io.Writer) error {
	if len(rep.Figures) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\tratio\ttarget\tresult\tserver\t")
	for _, f := range rep.Figures {
		target, result := "-", "-"
		if f.Target != nil {
			target = f.Target.Text
			result = "met"
			if !*f.Met {
				result = "MISSED"
			}
		}
		if f.Partial {
			result += " (partial)"
		}
		server := f.Server
		if server == "" {
			server = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", f.Name, FormatValue(f.Value, f.Unit), FormatValue(f.Baseline, f.Unit), formatRatio(f.Ratio), target, result, server)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, f := range rep.Figures {
		fmt.Fprintf(w, "%s: %s; baseline: %s", f.Name, f.What, f.BaselineWhat)
		if f.Note != "" {
			fmt.Fprintf(w, " (%s)", f.Note)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func oneLine(f Figure) string {
	s := fmt.Sprintf("%s vs %s, ratio %s", FormatValue(f.Value, f.Unit), FormatValue(f.Baseline, f.Unit), formatRatio(f.Ratio))
	if f.Met != nil {
		if *f.Met {
			s += ", target " + f.Target.Text + " met"
		} else {
			s += ", target " + f.Target.Text + " MISSED"
		}
	}
	if f.Partial {
		s += " (partial: " + f.Note + ")"
	}
	return s
}

func formatRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", r)
}

// FormatValue renders a value in its unit for people.
func FormatValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "-"
	}
	switch unit {
	case "events/s", "ops/s":
		return fmt.Sprintf("%s %s", group3(v), unit)
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ms":
		if v < 1 {
			return fmt.Sprintf("%.0f µs", v*1000)
		}
		return fmt.Sprintf("%.2f ms", v)
	case "cores":
		return fmt.Sprintf("%.1f%% core", v*100)
	case "B/worker":
		return fmt.Sprintf("%s B/worker", group3(v))
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}

// group3 formats a non-negative number with thousands separators.
func group3(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
