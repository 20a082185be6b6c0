package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/termlog/termlog/internal/clock"
)

// Runner runs schedules against one cluster and checks it after each.
type Runner struct {
	C             *Cluster
	Rec           *OpLog
	RecoveryBound time.Duration
	// Settle is how long the cluster must stay healthy to count as
	// recovered (the store timeout: by then the leader has seen every
	// restart).
	Settle time.Duration
	Logf   func(format string, args ...any)
	// CheckHistory, when set, checks the operations recorded during a
	// schedule; dir is where it may save a visualisation.
	CheckHistory func(ops []Op, dir string) []Violation

	probes []*Probe
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// Result is one schedule's outcome.
type Result struct {
	Schedule Schedule
	Index    int
	Events   []string // what the runner did, with times
	Executed map[Fault]int
	Recovery time.Duration // heal -> healthy (-1: never)
	// For each meta leader cut from NATS: how long after the cut it
	// stopped leading, and another replica led a newer term (-1: not
	// while the cut held).
	LeaderStops, Takeovers []time.Duration
	Violations             []Violation
	Dir                    string // the schedule's export, history and notes
}

// StartProbes starts n probe workers recording into r.Rec.
func (r *Runner) StartProbes(n int, seed uint64) error {
	if r.stop != nil {
		return errors.New("chaos: probes already started (Close first)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	for i := range n {
		p, err := NewProbe(r.C, fmt.Sprintf("probe-%d", i+1), seed+uint64(i), r.Rec)
		if err != nil {
			return err
		}
		r.probes = append(r.probes, p)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			p.Run(ctx)
		}()
	}
	return nil
}

// Close stops the probes and waits for them.
func (r *Runner) Close() {
	if r.stop != nil {
		r.stop()
	}
	r.wg.Wait()
	r.stop, r.probes = nil, nil
}

func (r *Runner) quiet(q bool) {
	for _, p := range r.probes {
		p.Quiet(q)
	}
}

func (r *Runner) probeEndpoints() []string {
	var out []string
	for _, p := range r.probes {
		out = append(out, p.Endpoint)
	}
	return out
}

// status reads `status -o json` and records the read.
func (r *Runner) status(ctx context.Context) StatusRead {
	if r.Rec == nil {
		return r.C.ReadStatus(ctx)
	}
	returned := r.Rec.Invoke(Op{Client: "status", Kind: OpStatus})
	sr := r.C.ReadStatus(ctx)
	op := Op{Client: "status", Kind: OpStatus, Outcome: OutcomeOK}
	if sr.OK() {
		op.Seq, op.Workers = sr.Status.Seq, sr.Status.Workers
	} else {
		op.Outcome = OutcomeUnknown
	}
	returned(op)
	return sr
}

// runningWorkers maps the endpoint of each running worker process to the
// id it last registered (from its log).
func (r *Runner) runningWorkers() map[string]uint64 {
	out := map[string]uint64{}
	for _, w := range r.C.Workers {
		if w.Running() && !w.Paused() {
			b, _ := os.ReadFile(w.LogPath)
			out[r.C.Endpoints[w.Name]] = RegisteredID(string(b))
		}
	}
	return out
}

func (r *Runner) liveStores() []string {
	var out []string
	for _, s := range r.C.Stores {
		if s.Running() && !s.Paused() {
			out = append(out, r.C.StoreIDs[s.Name])
		}
	}
	return out
}

func (r *Runner) storeReplicas(ctx context.Context) (map[string][]ReplicaKey, error) {
	out := map[string][]ReplicaKey{}
	for _, s := range r.C.Stores {
		reps, err := r.C.StoreReplicas(ctx, s.Name)
		if err != nil {
			return nil, err
		}
		out[r.C.StoreIDs[s.Name]] = reps
	}
	return out, nil
}

// healthy reads the cluster once: status exits 0 and the worker and
// shard checks pass. It returns the read and what is still wrong.
func (r *Runner) healthy(ctx context.Context) (StatusRead, []Violation) {
	sr := r.status(ctx)
	if !sr.OK() {
		return sr, []Violation{{"status", fmt.Sprintf("exit %d: %s", sr.Code, sr.Err)}}
	}
	var v []Violation
	if sr.Code != 0 {
		v = append(v, Violation{"status", fmt.Sprintf("exit %d (degraded): %s", sr.Code, strings.Join(sr.Status.Health.Problems, "; "))})
	}
	v = append(v, Workers(sr.Status.Workers, r.runningWorkers(), r.probeEndpoints())...)
	reps, err := r.storeReplicas(ctx)
	if err != nil {
		return sr, append(v, Violation{"metrics", err.Error()})
	}
	v = append(v, Shards(ShardsInput{Status: sr.Status, Shards: r.C.Cfg.Shards, Replicas: 3, LiveStores: r.liveStores(), StoreReplicas: reps})...)
	return sr, v
}

// WaitHealthy polls until the cluster is healthy and stays so for
// r.Settle (a read right after a restart can still reflect the state
// before it: the leader marks a store down only after the store timeout,
// so a store killed again a second ago is still "running" in its record).
// It returns how long after the call the healthy stretch began (-1: none
// within within) and the last problems.
func (r *Runner) WaitHealthy(ctx context.Context, within time.Duration) (time.Duration, []Violation) {
	start := time.Now()
	deadline := start.Add(within)
	var since time.Time // start of the current healthy stretch
	for {
		read := time.Now()
		_, v := r.healthy(ctx)
		switch {
		case len(v) > 0:
			since = time.Time{}
		case since.IsZero():
			since = read
		}
		if !since.IsZero() && time.Since(since) >= r.Settle {
			return since.Sub(start), nil
		}
		if ctx.Err() != nil || time.Now().After(deadline.Add(r.Settle)) || (since.IsZero() && time.Now().After(deadline)) {
			return -1, v
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond): // polling interval
		}
	}
}

// leader finds the meta leader from the replicas' /metrics: the running,
// unpaused replica that says it leads, with the highest term.
func (r *Runner) leader(ctx context.Context) *Proc {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var best *Proc
		var bestTerm uint64
		for _, m := range r.C.Metas {
			if !m.Running() || m.Paused() {
				continue
			}
			leading, term, err := r.C.MetaLeading(ctx, m.Name)
			if err == nil && leading && term > bestTerm {
				best, bestTerm = m, term
			}
		}
		if best != nil {
			return best
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
	return nil
}

type stepLog struct {
	mu         sync.Mutex
	start      time.Time
	lines      []string
	counts     map[Fault]int
	violations []Violation
	stops      []time.Duration // cut meta leader: cut -> not leading
	takeovers  []time.Duration // cut meta leader: cut -> another leads a newer term
	logf       func(string, ...any)
}

func (l *stepLog) add(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fmt.Sprintf("+%6.2fs ", time.Since(l.start).Seconds()) + fmt.Sprintf(f, a...)
	l.lines = append(l.lines, line)
	if l.logf != nil {
		l.logf("%s", line)
	}
}

func (l *stepLog) count(f Fault) {
	l.mu.Lock()
	l.counts[f]++
	l.mu.Unlock()
}

// violate records violations a step saw while it ran.
func (l *stepLog) violate(vs ...Violation) {
	l.mu.Lock()
	l.violations = append(l.violations, vs...)
	l.mu.Unlock()
}

// measure records, for a meta leader cut from NATS, when it stopped
// leading and when another replica led (-1: not while the cut held).
func (l *stepLog) measure(stopped, other time.Duration) {
	l.mu.Lock()
	l.stops = append(l.stops, stopped)
	l.takeovers = append(l.takeovers, other)
	l.mu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) { clock.Sleep(ctx, clock.Real{}, d) }

func startQuiet(p *Proc) error {
	if p.Running() {
		return nil
	}
	p.Reap()
	// Another step's heal may have started it since the look above.
	if err := p.Start(); err != nil && !errors.Is(err, ErrAlreadyRunning) {
		return err
	}
	return nil
}

func procNames(ps []*Proc) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// Run runs one schedule: its faults (each in its own goroutine, started
// at its offset), then the heal, the wait for health, and every check.
// dir receives the schedule's export, its history and its step log.
func (r *Runner) Run(ctx context.Context, s Schedule, index int, dir string) Result {
	res := Result{Schedule: s, Index: index, Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.Violations = append(res.Violations, Violation{"runner", err.Error()})
		return res
	}
	if r.Rec != nil {
		r.Rec.Reset()
	}
	l := &stepLog{start: time.Now(), counts: map[Fault]int{}, logf: r.Logf}
	l.add("schedule %d: %s", index, s)

	// Status reads all along, for the history (and to see reads work
	// under faults).
	rctx, stopReads := context.WithCancel(ctx)
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for rctx.Err() == nil {
			r.status(rctx)
			sleepCtx(rctx, 700*time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, len(s.Steps))
	for _, st := range s.Steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleepCtx(ctx, st.At)
			if err := r.runStep(ctx, st, l); err != nil {
				errs <- fmt.Errorf("%s: %w", st, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		res.Violations = append(res.Violations, Violation{"runner", err.Error()})
	}
	res.Violations = append(res.Violations, l.violations...)
	res.LeaderStops, res.Takeovers = l.stops, l.takeovers
	r.quiet(true)
	defer r.quiet(false)
	restarted, err := r.C.Heal()
	if err != nil {
		res.Violations = append(res.Violations, Violation{"runner", "heal: " + err.Error()})
	}
	if len(restarted) > 0 {
		l.add("heal: started %v", restarted)
	} else {
		l.add("heal: every process runs")
	}
	took, last := r.WaitHealthy(ctx, r.RecoveryBound)
	res.Recovery = took
	if took >= 0 {
		l.add("healthy %.2fs after the heal", took.Seconds())
	} else {
		l.add("not healthy within %s; last: %v", r.RecoveryBound, last)
	}
	stopReads()
	readers.Wait()
	res.Violations = append(res.Violations, Recovered(took, r.RecoveryBound)...)

	// The checks, from the outside.
	res.Violations = append(res.Violations, r.check(ctx, dir)...)
	if r.Rec != nil {
		if err := r.Rec.Save(filepath.Join(dir, "ops.jsonl")); err != nil {
			res.Violations = append(res.Violations, Violation{"runner", err.Error()})
		}
		if r.CheckHistory != nil {
			res.Violations = append(res.Violations, r.CheckHistory(r.Rec.Ops(), dir)...)
		}
	}
	res.Executed = l.counts
	for _, v := range res.Violations {
		l.add("VIOLATION %s", v)
	}
	res.Events = l.lines
	_ = os.WriteFile(filepath.Join(dir, "steps.txt"), []byte(strings.Join(l.lines, "\n")+"\n"), 0o644)
	return res
}

// check collects the cluster's state from the outside and runs the checks.
func (r *Runner) check(ctx context.Context, dir string) []Violation {
	var out []Violation
	export := filepath.Join(dir, "export.jsonl")
	evs, err := r.C.Export(ctx, export)
	if err != nil {
		out = append(out, Violation{CheckLog, err.Error()})
	} else {
		rc, err := r.C.ReplayCheck(ctx, export)
		if err != nil {
			out = append(out, Violation{CheckLog, err.Error()})
		}
		out = append(out, LogContiguous(evs, rc.Code, rc.Stdout+rc.Stderr)...)
		out = append(out, OneWriterPerTerm(evs)...)
		if f, err := os.Open(export); err != nil {
			out = append(out, Violation{CheckQuorum, err.Error()})
		} else {
			qv, err := QuorumKept(f)
			f.Close()
			if err != nil {
				qv = append(qv, Violation{CheckQuorum, err.Error()})
			}
			out = append(out, qv...)
		}
	}
	_, v := r.healthy(ctx)
	out = append(out, v...)
	logs := map[string]string{}
	for _, p := range r.C.All() {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			out = append(out, Violation{CheckPanics, err.Error()})
			continue
		}
		logs[p.Name] = string(b)
	}
	out = append(out, NoPanics(logs)...)
	exits := map[string][]string{}
	for _, p := range r.C.All() {
		if e := p.Unasked(); len(e) > 0 {
			exits[p.Name] = e
		}
	}
	out = append(out, NoExits(exits)...)
	return out
}
