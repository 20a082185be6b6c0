package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

const replayCluster = "benchreplay"

func (r *run) replay(ctx context.Context) error {
	w, err := r.workload()
	if err != nil {
		return err
	}
	e, err := r.server()
	if err != nil {
		return err
	}
	nc, err := e.connect("bench-replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	log, err := r.replayLog(ctx, nc, js, "replay")
	if err != nil {
		return err
	}
	n := len(w.bodies)
	bound := r.cfg.PhaseTimeout

	// Baseline: a raw ordered consumer reading the same stream.
	runtime.GC()
	rawTook, rawBytes, err := rawRead(ctx, js, log.Stream(), n, bound)
	if err != nil {
		return fmt.Errorf("raw ordered consumer: %w", err)
	}
	raw := float64(n) / rawTook.Seconds()
	base := fmt.Sprintf("raw jetstream ordered consumer (default options) reading the same %d messages (%d MB)", n, rawBytes>>20)

	// Log.Read + fold: what status, worker list and replay do.
	runtime.GC()
	rctx, cancel := context.WithTimeout(ctx, bound)
	start := time.Now()
	st := projections.New()
	r.profile("replay.read", func() {
		err = log.Read(rctx, 1, func(rec events.Record) error {
			st.ApplyRecord(rec)
			return nil
		})
	})
	readTook := time.Since(start)
	cancel()
	readPartial := false
	if err != nil {
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read: %w", err)
		}
		readPartial = true
	}
	if !readPartial && st.Counters.Applied != uint64(n) {
		return fmt.Errorf("read and fold: %+v, want %d applied", st.Counters, n)
	}
	f := Figure{
		Name: "replay.read", What: "natslog Log.Read + State.ApplyRecord from seq 1 to the tail (client.Load)",
		Unit: "events/s", Value: float64(st.Seq) / readTook.Seconds(), Baseline: raw, BaselineWhat: base, Higher: true,
		Target:  &Target{Of: "ratio", Op: "<=", Limit: 1.25, Text: "<= 1.25x raw consumer"},
		Partial: readPartial,
		Extra:   map[string]float64{"seconds": readTook.Seconds(), "raw_seconds": rawTook.Seconds()},
	}
	if readPartial {
		f.Note = fmt.Sprintf("stopped by the %s bound at seq %d of %d", bound, st.Seq, n)
	}
	r.add(f)

	// A Projector catching up as a new leader does (CatchUp = Tail +
	// WaitSeq), and the same Projector with nobody waiting on it.
	runtime.GC()
	var waitedR catchUpResult
	r.profile("replay.projector", func() { waitedR, err = projectorCatchUp(ctx, log, n, bound, true) })
	if err != nil {
		return err
	}
	waited, wseq, wpartial := waitedR.took, waitedR.seq, waitedR.partial
	runtime.GC()
	polledR, err := projectorCatchUp(ctx, log, n, bound, false)
	if err != nil {
		return err
	}
	polled, ppartial := polledR.took, polledR.partial
	f = Figure{
		Name: "replay.projector", What: "client.Projector.Run catching up to the tail while CatchUp waits on it (a new leader's start; catch-up without snapshot)",
		Unit: "events/s", Value: float64(wseq) / waited.Seconds(), Baseline: raw, BaselineWhat: base, Higher: true,
		Target:  &Target{Of: "ratio", Op: "<=", Limit: 1.25, Text: "<= 1.25x raw consumer"},
		Partial: wpartial,
		Extra: map[string]float64{"seconds": waited.Seconds(), "no_waiter_events_s": float64(n) / polled.Seconds(),
			"no_waiter_seconds": polled.Seconds(), "raw_seconds": rawTook.Seconds()},
	}
	if wpartial {
		f.Note = fmt.Sprintf("stopped by the %s bound at seq %d of %d", bound, wseq, n)
	}
	if ppartial {
		f.Note += "; the run without a waiter was stopped by the bound too"
	}
	r.add(f)
	return nil
}

// replayLog opens the stream of the replay workload on nc, filling it on
// first use: the replay and catch-up groups read the same stream.
func (r *run) replayLog(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, group string) (*natslog.Log, error) {
	w, err := r.workload()
	if err != nil {
		return nil, err
	}
	log, err := openLog(ctx, nc, replayCluster)
	if err != nil {
		return nil, err
	}
	if r.replayFilled {
		return log, nil
	}
	n := len(w.bodies)
	r.progress("%s: publishing %d events into stream %s", group, n, log.Stream())
	took, err := fill(ctx, js, log, w.events, w.bodies)
	if err != nil {
		return nil, err
	}
	r.replayFilled = true
	r.progress("%s: published %d events in %s (%.0f events/s)", group, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	return log, nil
}

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
	origin  client.Origin
	state   *projections.State // when it reached n with wait
}

// projectorCatchUp runs a fresh Projector (with opts) over log until it has
// folded n events. With wait, the caller blocks in CatchUp as a new leader
// does; without, it polls Seq every millisecond.
func projectorCatchUp(ctx context.Context, log *natslog.Log, n int, bound time.Duration, wait bool, opts ...client.ProjectorOption) (catchUpResult, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := client.NewProjector(log, zerolog.Nop(), nil, opts...)
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
