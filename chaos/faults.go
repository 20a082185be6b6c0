package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// faultKind is one row of the fault table: how a schedule draws a step of
// the kind, what the step hits when it runs, how it injects, holds and
// heals the fault, and what recovery from it means. Adding a fault kind is
// its Fault constant and one row.
type faultKind struct {
	fault Fault
	// partition: the kind cuts links, so it needs a Netns cluster and is
	// drawn only there.
	partition bool
	// unit names what Step.Target indexes ("worker", "store", "nats");
	// "" when the victim is found when the step runs (the meta leader).
	unit string
	// draw sets a generated step's Target, Hold and Repeat.
	draw func(d drawer, cfg Config, st *Step)
	// aim finds the step's victim when it runs.
	aim func(ctx context.Context, r *Runner, st Step) victim
	// inject starts the fault; hold keeps it (nil: sleep st.Hold); heal
	// ends it (nil: the fault ends by itself).
	inject, hold, heal func(ctx context.Context, r *Runner, st Step, l *stepLog, v victim) error
	// recovery is what the checks after the heal wait for from this kind,
	// beside what every schedule ends with (status exit 0, every running
	// worker registered, every shard at full replicas on live stores, a
	// contiguous log with one writer per term, no panic, no exit unasked).
	recovery string
}

// victim is what a step hits: a process and, for a partition, the peers
// it is cut from (what names the victim in the step log). A nil p skips
// the step, for the reason skip.
type victim struct {
	p     *Proc
	what  string
	peers []string
	skip  string
}

// faultTable is every fault kind, in the order ProcessFaults, Partitions
// and Faults list them (Generate draws by index: the order is part of
// every seed's schedule).
var faultTable = []faultKind{
	{
		fault: MetaLeaderKill,
		draw:  func(d drawer, cfg Config, st *Step) { st.Hold = d.between(cfg.Lease+cfg.Lease/2, 3*cfg.Lease) },
		aim:   aimMetaLeader,
		inject: func(_ context.Context, _ *Runner, _ Step, l *stepLog, v victim) error {
			l.add("SIGKILL meta leader %s", v.p.Name)
			return v.p.Kill()
		},
		heal:     restart,
		recovery: "another replica leads a newer term within the lease; the killed one comes back as a follower",
	},
	{
		fault: MetaLeaderPause,
		draw:  func(d drawer, cfg Config, st *Step) { st.Hold = d.between(cfg.Lease+cfg.Lease/2, 3*cfg.Lease) },
		aim:   aimMetaLeader,
		inject: func(_ context.Context, _ *Runner, _ Step, l *stepLog, v victim) error {
			l.add("SIGSTOP meta leader %s", v.p.Name)
			if err := v.p.Pause(); errors.Is(err, ErrNotRunning) {
				// Aimed while it ran, gone before the signal: an
				// overlapping step (a meta-leader-kill) killed it. The
				// pause has no victim left.
				return fmt.Errorf("%w: %s ended before its SIGSTOP (an overlapping step killed it)", errStepSkipped, v.p.Name)
			} else if err != nil {
				return err
			}
			return nil
		},
		heal: func(_ context.Context, _ *Runner, _ Step, l *stepLog, v victim) error {
			l.add("SIGCONT %s", v.p.Name)
			if v.p.Paused() {
				return v.p.Resume()
			}
			return nil
		},
		recovery: "the woken leader, its lease gone, writes nothing of its old term and follows the newer one",
	},
	{
		fault: WorkerKill,
		unit:  "worker",
		draw: func(d drawer, cfg Config, st *Step) {
			st.Target = d.r.IntN(cfg.Workers)
			st.Hold = d.between(0, cfg.WorkerTimeout*2)
		},
		aim: func(_ context.Context, r *Runner, st Step) victim {
			return victim{p: r.C.Workers[st.Target%len(r.C.Workers)]}
		},
		inject: kill,
		heal: func(_ context.Context, r *Runner, _ Step, l *stepLog, v victim) error {
			l.add("start %s at %s", v.p.Name, r.C.Endpoints[v.p.Name])
			return startQuiet(v.p)
		},
		recovery: "the worker is registered again at its endpoint under the id it last registered",
	},
	{
		fault: StoreRapidRestart,
		unit:  "store",
		draw: func(d drawer, cfg Config, st *Step) {
			st.Target = d.r.IntN(cfg.Stores)
			st.Hold = d.between(100*time.Millisecond, time.Second)
			st.Repeat = 2 + d.r.IntN(3)
		},
		aim:      aimStore,
		inject:   rapidRestarts,
		hold:     func(context.Context, *Runner, Step, *stepLog, victim) error { return nil }, // the restarts are Hold apart
		recovery: "the store runs (restarted by itself), and every shard is back at full replicas without a change losing quorum",
	},
	{
		fault: StoreReplaced,
		unit:  "store",
		draw: func(d drawer, cfg Config, st *Step) {
			st.Target = d.r.IntN(cfg.Stores)
			st.Hold = d.between(0, 2*time.Second)
		},
		aim:      aimStore,
		inject:   downUntilReplaced,
		heal:     killIntoReturn,
		recovery: "the removed replicas stay removed (no zombie), the new ones are added, and every shard is at full replicas",
	},
	{
		fault: NATSKill,
		unit:  "nats",
		draw: func(d drawer, cfg Config, st *Step) {
			if cfg.Topology == R3 {
				st.Target = d.r.IntN(3)
			}
			st.Hold = d.between(200*time.Millisecond, 3*time.Second)
		},
		aim:      aimNATS,
		inject:   kill,
		heal:     restart,
		recovery: "every role is connected again and status reads the stream (on R3 it never stopped: the majority served it)",
	},
	{
		fault: PartitionMetaLeader, partition: true,
		draw:     func(d drawer, cfg Config, st *Step) { st.Hold = d.between(cfg.Lease+cfg.Lease/2, 3*cfg.Lease) },
		aim:      cutFrom(aimMetaLeader, natsNodes),
		inject:   cut,
		hold:     watchCutLeader,
		heal:     uncut,
		recovery: "the cut leader stopped leading within its lease while it was cut (cut-leader-stops), and nothing it sent late landed",
	},
	{
		fault: PartitionStoreNATS, partition: true, unit: "store",
		draw: func(d drawer, cfg Config, st *Step) {
			st.Target = d.r.IntN(cfg.Stores)
			st.Hold = d.between(cfg.StoreTimeout/2, 3*cfg.StoreTimeout)
		},
		aim:      cutFrom(aimStore, natsNodes),
		inject:   cut,
		heal:     uncut,
		recovery: "no replica replaced while the store was cut survives the heal as a zombie, and every shard is at full replicas",
	},
	{
		fault: PartitionStoreRaft, partition: true, unit: "store",
		draw: func(d drawer, cfg Config, st *Step) {
			st.Target = d.r.IntN(cfg.Stores)
			st.Hold = d.between(time.Second, 6*time.Second)
		},
		aim:      cutFrom(aimStore, func(r *Runner, p *Proc) []string { return others(r.C.Stores, p) }),
		inject:   cut,
		heal:     uncut,
		recovery: "the store's replicas catch up with their peers, and every shard is at full replicas",
	},
	{
		fault: PartitionNATSNode, partition: true, unit: "nats",
		draw: func(d drawer, cfg Config, st *Step) {
			if cfg.Topology == R3 {
				st.Target = d.r.IntN(3)
			}
			st.Hold = d.between(time.Second, 6*time.Second)
		},
		aim: cutFrom(aimNATS, func(r *Runner, p *Proc) []string {
			if len(r.C.NATS) > 1 {
				return others(r.C.NATS, p)
			}
			// The only server: cut from every role at once.
			return append(append(procNames(r.C.Metas), procNames(r.C.Stores)...), ClientNode)
		}),
		inject:   cut,
		heal:     uncut,
		recovery: "every role is connected again and status reads the stream",
	},
}

// kindOf is the row of f (the zero row for an unknown fault).
func kindOf(f Fault) faultKind {
	for _, k := range faultTable {
		if k.fault == f {
			return k
		}
	}
	return faultKind{}
}

// faultsOf lists the kinds of the table that are partitions, or not.
func faultsOf(partition bool) []Fault {
	var out []Fault
	for _, k := range faultTable {
		if k.partition == partition {
			out = append(out, k.fault)
		}
	}
	return out
}

// drawer draws a generated step's numbers.
type drawer struct{ r *rand.Rand }

func (d drawer) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(d.r.Int64N(int64(hi-lo)+1))
}

// errStepSkipped ends a step whose victim went away between its aim and
// its inject (another step of the schedule ended it): nothing was done,
// the step is logged as skipped, not counted, not a violation.
var errStepSkipped = errors.New("victim gone")

// runStep runs one step: its row's victim, inject, hold and heal.
func (r *Runner) runStep(ctx context.Context, st Step, l *stepLog) error {
	k := kindOf(st.Fault)
	if k.aim == nil {
		return fmt.Errorf("unknown fault %q", st.Fault)
	}
	v := k.aim(ctx, r, st)
	if v.p == nil {
		l.add("%s: %s; skipped", st.Fault, v.skip)
		return nil
	}
	if k.partition && r.C.Net == nil {
		return fmt.Errorf("%s needs a Netns cluster", st.Fault)
	}
	if err := k.inject(ctx, r, st, l, v); errors.Is(err, errStepSkipped) {
		l.add("%s: %v; skipped", st.Fault, err)
		return nil
	} else if err != nil {
		l.count(st.Fault)
		return err
	}
	l.count(st.Fault)
	if k.hold == nil {
		sleepCtx(ctx, st.Hold)
	} else if err := k.hold(ctx, r, st, l, v); err != nil {
		return err
	}
	if k.heal == nil {
		return nil
	}
	return k.heal(ctx, r, st, l, v)
}

func aimMetaLeader(ctx context.Context, r *Runner, _ Step) victim {
	v := victim{p: r.leader(ctx), skip: "no meta leader found"}
	if v.p != nil {
		v.what = "meta leader " + v.p.Name
	}
	return v
}

// cutFrom aims as aim does, and cuts the victim from peers(r, victim).
func cutFrom(aim func(context.Context, *Runner, Step) victim, peers func(r *Runner, p *Proc) []string) func(context.Context, *Runner, Step) victim {
	return func(ctx context.Context, r *Runner, st Step) victim {
		v := aim(ctx, r, st)
		if v.p != nil {
			v.peers = peers(r, v.p)
		}
		return v
	}
}

// natsNodes is every NATS node: the peers of a victim cut from NATS.
func natsNodes(r *Runner, _ *Proc) []string { return procNames(r.C.NATS) }

// others names the procs of ps but p.
func others(ps []*Proc, p *Proc) []string {
	return procNames(slices.DeleteFunc(slices.Clone(ps), func(o *Proc) bool { return o == p }))
}

func aimStore(_ context.Context, r *Runner, st Step) victim {
	s := r.C.Stores[st.Target%len(r.C.Stores)]
	return victim{p: s, what: s.Name}
}

func aimNATS(_ context.Context, r *Runner, st Step) victim {
	n := r.C.NATS[st.Target%len(r.C.NATS)]
	return victim{p: n, what: n.Name}
}

func kill(_ context.Context, _ *Runner, _ Step, l *stepLog, v victim) error {
	l.add("SIGKILL %s", v.p.Name)
	return v.p.Kill()
}

func restart(_ context.Context, _ *Runner, _ Step, l *stepLog, v victim) error {
	l.add("start %s", v.p.Name)
	return startQuiet(v.p)
}

// rapidRestarts SIGKILLs the store and starts it at once, st.Repeat
// times, st.Hold apart.
func rapidRestarts(ctx context.Context, _ *Runner, st Step, l *stepLog, v victim) error {
	for i := range st.Repeat {
		l.add("SIGKILL %s and start it (%d of %d)", v.p.Name, i+1, st.Repeat)
		if err := v.p.Kill(); err != nil {
			return err
		}
		if err := startQuiet(v.p); err != nil {
			return err
		}
		sleepCtx(ctx, st.Hold)
	}
	return nil
}

// downUntilReplaced SIGKILLs the store and keeps it down until the leader
// has removed its replicas (every shard that had one on it no longer lists
// it), so that it comes back with data of removed replicas: the second
// report's zombie candidate. With another store down too nothing can be
// removed (no quorum after the change): it waits StoreTimeout+20s, then
// starts it anyway.
func downUntilReplaced(ctx context.Context, r *Runner, _ Step, l *stepLog, v victim) error {
	s, id := v.p, r.C.StoreIDs[v.p.Name]
	l.add("SIGKILL %s; down until its replicas are removed", s.Name)
	if err := s.Kill(); err != nil {
		return err
	}
	began := time.Now()
	removed := false
	for !removed && time.Since(began) < r.C.Cfg.StoreTimeout+20*time.Second && ctx.Err() == nil {
		sleepCtx(ctx, 250*time.Millisecond) // polling interval
		sr := r.C.ReadStatus(ctx)
		if !sr.OK() {
			continue
		}
		removed = true
		for _, sh := range sr.Status.Shards {
			if slices.Contains(mapValues(sh.Members), id) {
				removed = false
			}
		}
	}
	if removed {
		l.add("%s: its replicas removed after %.1fs down; start it", s.Name, time.Since(began).Seconds())
	} else {
		l.add("%s: its replicas not removed after %.1fs down; start it", s.Name, time.Since(began).Seconds())
	}
	return startQuiet(s)
}

// killIntoReturn SIGKILLs the returned store again, st.Hold into its
// return (while its new replicas are being added), then starts it for good.
func killIntoReturn(ctx context.Context, _ *Runner, st Step, l *stepLog, v victim) error {
	l.add("SIGKILL %s again, %s into its return", v.p.Name, st.Hold.Round(time.Millisecond))
	if err := v.p.Kill(); err != nil {
		return err
	}
	sleepCtx(ctx, 500*time.Millisecond)
	l.add("start %s", v.p.Name)
	return startQuiet(v.p)
}

// cut cuts the victim from each of its peers.
func cut(ctx context.Context, r *Runner, _ Step, l *stepLog, v victim) error {
	l.add("cut %s from %s", v.what, strings.Join(v.peers, ", "))
	return r.C.Cut(ctx, v.p.Name, v.peers...)
}

// uncut releases exactly the victim's cuts (an overlapping fault keeps its
// own).
func uncut(_ context.Context, r *Runner, _ Step, l *stepLog, v victim) error {
	l.add("heal %s's links to %s", v.p.Name, strings.Join(v.peers, ", "))
	// Not the run's ctx: an interrupted run still heals what it cut.
	return r.C.Uncut(context.Background(), v.p.Name, v.peers...)
}

// watchCutLeader holds the meta leader's cut, watching from the outside
// (its /metrics, on its own loopback) when it stops leading and when
// another replica leads a newer term, and judges its step-down.
func watchCutLeader(ctx context.Context, r *Runner, st Step, l *stepLog, v victim) error {
	m := v.p
	cutAt := time.Now()
	_, oldTerm, _ := r.C.MetaLeading(ctx, m.Name)
	w := cutWatch{stopped: -1, other: -1}
	for time.Since(cutAt) < st.Hold && ctx.Err() == nil {
		if !m.Running() || m.Paused() {
			w.void = true
		}
		if w.stopped < 0 && !w.void {
			w.scrapeCut(ctx, r, l, m, cutAt)
		}
		if w.other < 0 {
			w.scrapeOthers(ctx, r, l, m, cutAt, oldTerm)
		}
		sleepCtx(ctx, 100*time.Millisecond) // polling interval
	}
	if w.failed > 0 {
		l.add("%d of %d scrapes of %s failed while it was cut; the last: %v", w.failed, w.scrapes, m.Name, w.lastErr)
	}
	if w.void {
		l.add("%s was paused or killed during its cut: its step-down is not judged", m.Name)
	} else if ctx.Err() == nil {
		l.measure(w.stopped, w.other)
		l.violate(LeaderStopped(m.Name, w.stopped, st.Hold, r.C.Cfg.Lease, time.Second)...)
	}
	return nil
}

// cutWatch is what watchCutLeader saw: since the cut, when the cut leader
// stopped leading and another led (-1: not yet), and whether an
// overlapping step paused or killed it (void: nothing to judge).
type cutWatch struct {
	stopped, other  time.Duration
	void            bool
	scrapes, failed int
	lastErr         error
}

// scrapeCut asks the cut leader m whether it still leads.
func (w *cutWatch) scrapeCut(ctx context.Context, r *Runner, l *stepLog, m *Proc, cutAt time.Time) {
	began := time.Now()
	leading, _, err := r.C.MetaLeading(ctx, m.Name)
	w.scrapes++
	switch {
	case err != nil:
		w.failed, w.lastErr = w.failed+1, fmt.Errorf("%w (after %s)", err, time.Since(began).Round(time.Millisecond))
	case !leading:
		w.stopped = time.Since(cutAt)
		l.add("%s stopped leading %s after the cut", m.Name, w.stopped.Round(time.Millisecond))
	}
}

// scrapeOthers asks the other running replicas whether one leads a term
// newer than oldTerm.
func (w *cutWatch) scrapeOthers(ctx context.Context, r *Runner, l *stepLog, m *Proc, cutAt time.Time, oldTerm uint64) {
	for _, o := range r.C.Metas {
		if o == m || !o.Running() || o.Paused() {
			continue
		}
		if leading, term, err := r.C.MetaLeading(ctx, o.Name); err == nil && leading && term > oldTerm {
			w.other = time.Since(cutAt)
			l.add("%s leads term %d %s after the cut", o.Name, term, w.other.Round(time.Millisecond))
		}
	}
}
