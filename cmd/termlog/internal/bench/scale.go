package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/natsserver"
)

// DefaultScale is the scale group's worker counts (--scale).
var DefaultScale = []int{1000, 10_000, 30_000, 100_000}

// ScalePoint is one size of the scale group on one server configuration,
// every figure next to its raw baseline from the same point. Times are in
// seconds, latencies in milliseconds, CPU in cores, memory in bytes.
type ScalePoint struct {
	Replicas int    `json:"replicas"`
	Workers  int    `json:"workers"`
	Server   string `json:"server"`
	// The registration burst: every worker registered and visible on the 3
	// replicas; the raw responder on the same server.
	BurstS         float64 `json:"burst_s"`
	BurstPartial   bool    `json:"burst_partial,omitempty"`
	BurstActiveS   float64 `json:"burst_active_s"`
	RawBurstS      float64 `json:"raw_burst_s"`
	RawBurstPartly bool    `json:"raw_burst_partial,omitempty"`
	// The leader killed: the first worker answered by the new leader, its
	// recovery complete, and a raw KV lease handover.
	FailoverS          float64 `json:"failover_served_s"`
	FailoverRecoveredS float64 `json:"failover_recovered_s"`
	RawLeaseS          float64 `json:"raw_lease_handover_s"`
	// Heartbeats at 1 Hz: p99 at the worker and the leader's CPU, the
	// trivial responder's under the same load.
	HeartbeatP99    float64 `json:"heartbeat_p99_ms"`
	RawHeartbeatP99 float64 `json:"raw_heartbeat_p99_ms"`
	LeaderCores     float64 `json:"leader_cores"`
	ResponderCores  float64 `json:"responder_cores"`
	// Live heap and stacks of the whole process at steady state (3 meta
	// replicas, the N worker clients, the embedded server), per worker.
	HeapPerWorker  float64 `json:"heap_b_per_worker"`
	StackPerWorker float64 `json:"stacks_b_per_worker"`
	// One leading replica alone (meta.New on an in-memory log, in-memory
	// control streams), heap + stacks per worker: the memory group's
	// memory.leader at this size.
	LeaderBPerWorker float64 `json:"leader_b_per_worker"`
	TookS            float64 `json:"took_s"`
	// Problem says what stopped the point short ("" when it ran through).
	Problem string `json:"problem,omitempty"`
}

// scale runs the register, heartbeat, failover and memory measurements at
// each of the Scale sizes on each of the ScaleReplicas configurations, each
// point on a fresh server with sync always (the durable default), and
// writes the plot when Plot is set.
func (r *run) scale(ctx context.Context) error {
	for _, reps := range r.cfg.ScaleReplicas {
		for _, n := range r.cfg.Scale {
			p := r.scalePoint(ctx, reps, n)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.rep.Scale = append(r.rep.Scale, p)
			r.addScaleTargets(p)
		}
	}
	if r.cfg.Plot == "" {
		return nil
	}
	if err := writePlotFile(r.cfg.Plot, r.rep); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	r.progress("scale: plot written to %s", r.cfg.Plot)
	return nil
}

// scalePoint measures one size on a fresh server of reps replicas.
func (r *run) scalePoint(ctx context.Context, reps, n int) (p ScalePoint) {
	p = ScalePoint{Replicas: reps, Workers: n}
	start := time.Now()
	defer func() { p.TookS = time.Since(start).Seconds() }()
	if m, err := r.memoryAt(ctx, n); err != nil {
		p.Problem = fmt.Sprintf("memory: %v", err)
	} else {
		p.LeaderBPerWorker = m.leader
	}
	dir := filepath.Join(r.dir, fmt.Sprintf("scale-r%d-%d", reps, n))
	e, err := startEnvSync(dir, natsserver.SyncAlways, reps)
	if err != nil {
		p.Problem = fmt.Sprintf("server: %v", err)
		return p
	}
	saved := r.env
	r.env = e
	defer func() {
		r.env = saved
		e.close()
		_ = os.RemoveAll(dir)
	}()
	p.Server = e.what()
	r.progress("scale: %d workers on %s", n, p.Server)
	conns, err := r.workerConns(n)
	if err != nil {
		p.Problem = fmt.Sprintf("connect: %v", err)
		return p
	}
	if err := r.measurePoint(ctx, conns, &p); err != nil {
		p.Problem = strings.TrimPrefix(p.Problem+"; "+err.Error(), "; ")
		r.progress("scale: %d workers on %s: %v", n, p.Server, err)
	}
	return p
}

// measurePoint fills p: the baseline burst and heartbeats, the burst, the
// steady phase (heartbeats, memory, failover). A bound that stops a burst
// leaves it partial and the point goes on.
func (r *run) measurePoint(ctx context.Context, conns []*nats.Conn, p *ScalePoint) error {
	n := p.Workers
	base, baseHB, err := r.baseline(ctx, conns, n, true)
	p.RawBurstS, p.RawBurstPartly = base.registered.Seconds(), !base.done()
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	p.RawHeartbeatP99, p.ResponderCores = ms(percentile(baseHB.lat, 99)), baseHB.cpu.share(baseHB.cpu.byLabel[labelResponder])
	res, err := r.runBurst(ctx, conns, n, fmt.Sprintf("scale.burst.r%d.%d", p.Replicas, n))
	if err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	p.BurstS, p.BurstPartial, p.BurstActiveS = res.registered.Seconds(), !res.done(), res.active.Seconds()
	s, err := r.steady(ctx, conns, n, steadyWants{heartbeat: true, memory: true, failover: true})
	p.HeartbeatP99, p.LeaderCores = ms(percentile(s.hb.lat, 99)), s.hb.cpu.share(s.hb.cpu.byLabel[s.leader])
	p.HeapPerWorker, p.StackPerWorker = float64(s.mem.heap), float64(s.mem.stacks)
	p.FailoverS, p.FailoverRecoveredS, p.RawLeaseS = s.fo.served.Seconds(), s.fo.recovered.Seconds(), s.fo.base.Seconds()
	return err
}

// addScaleTargets adds, as figures with a verdict, the points issue 21
// sets targets for: failover at 30,000 workers, heartbeat p99 at 10,000,
// and whether the largest size ran through.
func (r *run) addScaleTargets(p ScalePoint) {
	lease := r.cfg.Lease
	tag := fmt.Sprintf("r%d.%d", p.Replicas, p.Workers)
	add := func(f Figure) {
		f.Server, f.Partial = p.Server, p.Problem != ""
		if f.Partial {
			f.Note = p.Problem
		}
		r.add(f)
	}
	if p.Workers == 30_000 {
		add(Figure{Name: "scale.failover." + tag, Unit: "s", Value: p.FailoverS, Baseline: p.RawLeaseS,
			What:         fmt.Sprintf("leader killed -> first of %d heartbeating workers answered by the new leader", p.Workers),
			BaselineWhat: "raw KV lease handover (same TTL) on the same server",
			Target:       &Target{Of: "value", Op: "<=", Limit: (lease + 500*time.Millisecond).Seconds(), Text: fmt.Sprintf("< lease + 0.5 s = %s", lease+500*time.Millisecond)}})
	}
	if p.Workers == 10_000 {
		add(Figure{Name: "scale.heartbeat_p99." + tag, Unit: "ms", Value: p.HeartbeatP99, Baseline: p.RawHeartbeatP99,
			What:         fmt.Sprintf("heartbeat reply p99 at the worker, %d workers at 1 Hz", p.Workers),
			BaselineWhat: "the same workers against the trivial responder on the same server",
			Target:       &Target{Of: "ratio", Op: "<=", Limit: 2, Text: "<= 2x the trivial responder"}})
	}
}

// finite makes every figure of p JSON-safe (see WriteJSON).
func (p *ScalePoint) finite() {
	for _, v := range []*float64{&p.BurstS, &p.BurstActiveS, &p.RawBurstS, &p.FailoverS, &p.FailoverRecoveredS, &p.RawLeaseS,
		&p.HeartbeatP99, &p.RawHeartbeatP99, &p.LeaderCores, &p.ResponderCores, &p.HeapPerWorker, &p.StackPerWorker,
		&p.LeaderBPerWorker, &p.TookS} {
		*v = finite(*v)
	}
}

// writeScaleTable writes the scale group's points, each figure next to its
// raw baseline of the same point.
func (rep *Report) writeScaleTable(w io.Writer) error {
	fmt.Fprintln(w, "\nscale (sync always, one fresh server per point; burst = all registered and on 3 replicas; failover = leader killed -> first worker served; memory = whole process: 3 replicas + N worker clients + server, and one leading replica alone)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "R\tworkers\tburst\traw burst\tratio\tfailover\t(recovered)\traw lease\thb p99\traw p99\tratio\tleader CPU\tresponder CPU\theap/worker\tstacks/worker\ttook\tproblem\t")
	for _, p := range rep.Scale {
		burstRatio := ratioOf(p.BurstS, p.RawBurstS)
		if p.BurstPartial || p.RawBurstPartly {
			burstRatio = math.NaN() // a bound against a bound says nothing
		}
		fmt.Fprintf(tw, "R%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f s\t%s\t\n",
			p.Replicas, p.Workers, boundS(p.BurstS, p.BurstPartial), boundS(p.RawBurstS, p.RawBurstPartly), formatRatio(burstRatio),
			cell(p.FailoverS, "%.3f s", 1), cell(p.FailoverRecoveredS, "%.3f s", 1), cell(p.RawLeaseS, "%.3f s", 1),
			cell(p.HeartbeatP99, "%.1f ms", 1), cell(p.RawHeartbeatP99, "%.1f ms", 1), formatRatio(ratioOf(p.HeartbeatP99, p.RawHeartbeatP99)),
			cell(p.LeaderCores, "%.1f%%", 100), cell(p.ResponderCores, "%.1f%%", 100),
			bytesCell(p.HeapPerWorker), bytesCell(p.StackPerWorker), bytesCell(p.LeaderBPerWorker), p.TookS, orDash(p.Problem))
	}
	return tw.Flush()
}

// boundS is seconds, marked ">=" when a bound stopped the load.
func boundS(s float64, partial bool) string {
	if partial {
		return fmt.Sprintf(">= %.3f s (bound)", s)
	}
	return fmt.Sprintf("%.3f s", s)
}

// cell formats v*scale, or "-" for a figure not measured (0 or NaN).
func cell(v float64, format string, scale float64) string {
	if !(v > 0) {
		return "-"
	}
	return fmt.Sprintf(format, v*scale)
}

func bytesCell(v float64) string {
	if !(v > 0) {
		return "-"
	}
	return group3(v) + " B"
}

func ratioOf(v, base float64) float64 {
	if base <= 0 || v <= 0 {
		return math.NaN()
	}
	return v / base
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
