package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

const replayCluster = "benchreplay"

func (r *run) replay(ctx context.Context) error {
	w, err := r.workload()
	if err != nil {
		return err
	}
	nc, js, log, err := r.replayLog(ctx, "replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	n := len(w.bodies)
	bound := r.cfg.PhaseTimeout

	// Each figure's passes run interleaved with passes of its baseline, a
	// raw ordered consumer reading the same stream, as the fold figures do
	// (rates): drift of the machine hits both alike, and each reports its
	// median pass. A pass that the bound stops ends the series, and its
	// figure reports that pass alone next to the raw pass before it,
	// marked partial.
	var (
		rawBytes int
		rawLast  float64 // the rate of the last raw pass, for a partial figure
	)
	// Process CPU per event of each pass (server and client alike: one
	// process), next to the rates: less sensitive than the rates to other
	// load on the machine.
	rawCPU, readCPU, projCPU := &cpuPerEvent{n: n}, &cpuPerEvent{n: n}, &cpuPerEvent{n: n}
	rawPass := func() error {
		defer rawCPU.measure()()
		took, b, err := rawRead(ctx, js, log.Stream(), n, bound)
		if err != nil {
			return fmt.Errorf("raw ordered consumer: %w", err)
		}
		rawBytes, rawLast = b, float64(n)/took.Seconds()
		return nil
	}
	base := func() string {
		return fmt.Sprintf("raw jetstream ordered consumer (default options) reading the same %d messages (%d MB), passes interleaved, median", n, rawBytes>>20)
	}

	// Log.Read + fold: what status, worker list and replay do.
	var (
		readSeq     uint64
		readTook    time.Duration
		readPartial bool
	)
	readPass := func() error {
		defer readCPU.measure()()
		rctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		st := projections.New()
		start := time.Now()
		err := log.Read(rctx, 1, func(rec events.Record) error {
			st.ApplyRecord(rec)
			return nil
		})
		readTook, readSeq = time.Since(start), st.Seq
		switch {
		case err == nil && st.Counters.Applied != uint64(n):
			return fmt.Errorf("read and fold: %+v, want %d applied", st.Counters, n)
		case err == nil:
			return nil
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			readPartial = true
			return errPartial
		default:
			return fmt.Errorf("read: %w", err)
		}
	}
	var rs []float64
	rawCPU.reset()
	r.profile("replay.read", func() { rs, err = rates(ctx, n, rawPass, readPass) })
	if err != nil && !errors.Is(err, errPartial) {
		return err
	}
	f := Figure{
		Name: "replay.read", What: "natslog Log.Read + State.ApplyRecord from seq 1 to the tail (view.Load)",
		Unit: "events/s", Higher: true,
		Target: &Target{Of: "ratio", Op: "<=", Limit: 1.25, Text: "<= 1.25x raw consumer"},
	}
	if readPartial {
		f.Value, f.Baseline, f.Partial = float64(readSeq)/readTook.Seconds(), rawLast, true
		f.Note = fmt.Sprintf("stopped by the %s bound at seq %d of %d", bound, readSeq, n)
	} else {
		f.Value, f.Baseline = rs[1], rs[0]
		f.Extra = map[string]float64{"seconds": float64(n) / rs[1], "raw_seconds": float64(n) / rs[0]}
		cpuExtra(f.Extra, readCPU, rawCPU)
	}
	f.BaselineWhat = base()
	r.add(f)

	// A Projector catching up as a new leader does (CatchUp = Tail +
	// WaitSeq), and the same Projector with nobody waiting on it.
	var (
		waited   time.Duration
		wseq     uint64
		wpartial bool
	)
	projPass := func() error {
		defer projCPU.measure()()
		res, err := projectorCatchUp(ctx, log, n, bound, true)
		waited, wseq, wpartial = res.took, res.seq, res.partial
		if err == nil && wpartial {
			return errPartial
		}
		return err
	}
	rawCPU.reset()
	r.profile("replay.projector", func() { rs, err = rates(ctx, n, rawPass, projPass) })
	if err != nil && !errors.Is(err, errPartial) {
		return err
	}
	runtime.GC()
	polledR, err := projectorCatchUp(ctx, log, n, bound, false)
	if err != nil {
		return err
	}
	polled, ppartial := polledR.took, polledR.partial
	f = Figure{
		Name: "replay.projector", What: "view.Projector.Run catching up to the tail while CatchUp waits on it (a new leader's start; catch-up without snapshot)",
		Unit: "events/s", Higher: true,
		Target: &Target{Of: "ratio", Op: "<=", Limit: 1.25, Text: "<= 1.25x raw consumer"},
		Extra:  map[string]float64{"no_waiter_events_s": float64(n) / polled.Seconds(), "no_waiter_seconds": polled.Seconds()},
	}
	if wpartial {
		f.Value, f.Baseline, f.Partial = float64(wseq)/waited.Seconds(), rawLast, true
		f.Note = fmt.Sprintf("stopped by the %s bound at seq %d of %d", bound, wseq, n)
	} else {
		f.Value, f.Baseline = rs[1], rs[0]
		f.Extra["seconds"], f.Extra["raw_seconds"] = float64(n)/rs[1], float64(n)/rs[0]
		cpuExtra(f.Extra, projCPU, rawCPU)
	}
	if ppartial {
		f.Note += "; the run without a waiter was stopped by the bound too"
	}
	f.BaselineWhat = base()
	r.add(f)
	return nil
}

// replayLog connects to the bench server as "bench-<group>" and opens the
// stream of the replay workload, filling it on first use. The caller closes
// the connection.
func (r *run) replayLog(ctx context.Context, group string) (*nats.Conn, jetstream.JetStream, *natslog.Log, error) {
	w, err := r.workload()
	if err != nil {
		return nil, nil, nil, err
	}
	e, err := r.server()
	if err != nil {
		return nil, nil, nil, err
	}
	nc, err := e.connect("bench-" + group)
	if err != nil {
		return nil, nil, nil, err
	}
	js, log, err := r.fillReplay(ctx, nc, w, group)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return nc, js, log, nil
}

func (r *run) fillReplay(ctx context.Context, nc *nats.Conn, w *workload, group string) (jetstream.JetStream, *natslog.Log, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	log, err := r.env.openLog(ctx, nc, replayCluster)
	if err != nil {
		return nil, nil, err
	}
	if r.replayFilled {
		return js, log, nil
	}
	n := len(w.bodies)
	r.progress("%s: publishing %d events into stream %s", group, n, log.Stream())
	took, err := fill(ctx, js, log, w.events, w.bodies)
	if err != nil {
		return nil, nil, err
	}
	r.replayFilled = true
	r.progress("%s: published %d events in %s (%.0f events/s)", group, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	return js, log, nil
}

// cpuPerEvent collects the process CPU time per event of a series of passes.
type cpuPerEvent struct {
	n      int
	passes []float64 // µs per event
}

// measure starts measuring one pass; call what it returns at the end.
func (c *cpuPerEvent) measure() func() {
	c0, ok := processCPU()
	return func() {
		if c1, ok1 := processCPU(); ok && ok1 {
			c.passes = append(c.passes, float64(c1-c0)/float64(time.Microsecond)/float64(c.n))
		}
	}
}

func (c *cpuPerEvent) reset() { c.passes = nil }

// median is the median pass, 0 without any.
func (c *cpuPerEvent) median() float64 {
	if len(c.passes) == 0 {
		return 0
	}
	p := slices.Clone(c.passes)
	slices.Sort(p)
	return p[len(p)/2]
}

// cpuExtra adds the CPU per event of a figure's passes and of its raw
// passes, and their ratio, to extra.
func cpuExtra(extra map[string]float64, c, raw *cpuPerEvent) {
	v, b := c.median(), raw.median()
	if v == 0 || b == 0 {
		return
	}
	extra["cpu_us_per_event"], extra["raw_cpu_us_per_event"], extra["cpu_ratio"] = v, b, v/b
}

// errPartial ends a series of passes when the bound stopped one.
var errPartial = errors.New("stopped by the bound")

// rawRead reads n messages of stream with a plain ordered consumer.
func rawRead(ctx context.Context, js jetstream.JetStream, stream string, n int, bound time.Duration) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, 0, err
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, 0, err
	}
	defer it.Stop()
	bytes := 0
	for range n {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return 0, 0, err
		}
		bytes += len(msg.Data())
	}
	return time.Since(start), bytes, nil
}

// catchUpResult is one projector catch-up.
type catchUpResult struct {
	took    time.Duration
	seq     uint64 // reached
	partial bool   // the bound stopped it
	origin  view.Origin
	state   *projections.State // when it reached n with wait
}

// projectorCatchUp runs a fresh Projector (with opts) over log until it has
// folded n events. With wait, the caller blocks in CatchUp as a new leader
// does; without, it polls Seq every millisecond.
func projectorCatchUp(ctx context.Context, log *natslog.Log, n int, bound time.Duration, wait bool, opts ...view.ProjectorOption) (catchUpResult, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := view.NewProjector(log, zerolog.Nop(), nil, opts...)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	wg.Add(1)
	go func() { defer wg.Done(); _ = p.Run(pctx) }()
	bctx, bcancel := context.WithTimeout(ctx, bound)
	defer bcancel()
	if wait {
		v, err := p.CatchUp(bctx)
		took := time.Since(start)
		switch {
		case err == nil:
			if seq := p.Seq(); seq < uint64(n) {
				return catchUpResult{}, fmt.Errorf("projector caught up at seq %d, want %d", seq, n)
			}
			return catchUpResult{took: took, seq: uint64(n), origin: p.Origin(), state: v}, nil
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return catchUpResult{took: took, seq: p.Seq(), partial: true, origin: p.Origin()}, nil
		default:
			return catchUpResult{}, fmt.Errorf("projector catch-up: %w", err)
		}
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for p.Seq() < uint64(n) {
		select {
		case <-bctx.Done():
			if ctx.Err() != nil {
				return catchUpResult{}, ctx.Err()
			}
			return catchUpResult{took: time.Since(start), seq: p.Seq(), partial: true, origin: p.Origin()}, nil
		case <-tick.C:
		}
	}
	return catchUpResult{took: time.Since(start), seq: uint64(n), origin: p.Origin()}, nil
}
