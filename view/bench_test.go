package view_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// The Projector folding an in-memory log: what a replica pays per event
// apart from reading the stream.
//
//	go test -run '^$' -bench . ./view/

// benchLog holds n events over a steady population of about active
// workers: they register, activate, and are expired and replaced at the same
// endpoint, so the state stays the size of a real cluster.
func benchLog(b *testing.B, n, active int) *events.MemLog {
	b.Helper()
	log := events.NewMemLog()
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	seq := uint64(0)
	add := func(p events.Payload) uint64 {
		body, err := events.Encode(events.Event{Term: 1, Writer: "meta-1", At: at.Add(time.Duration(seq) * time.Millisecond), Data: p})
		if err != nil {
			b.Fatal(err)
		}
		log.AppendRaw(body)
		seq++
		return seq
	}
	add(events.TermStarted{Term: 1, Leader: "meta-1"})
	type slot struct{ id, epoch uint64 }
	slots := make([]slot, active)
	next := uint64(1)
	register := func(i int) {
		epoch := add(events.WorkerRegistered{ID: next, Incarnation: fmt.Sprintf("inc-%d", next),
			Endpoint: fmt.Sprintf("10.%d.%d.%d:5688", 1+i/65536, i/256%256, i%256), Kind: "compute", Parallelism: 4})
		slots[i] = slot{next, epoch}
		next++
	}
	for i := 0; int(seq) < n; i = (i + 1) % active {
		if slots[i].id != 0 {
			add(events.WorkerExpired{ID: slots[i].id, Epoch: slots[i].epoch})
		}
		register(i)
		add(events.WorkerActivated{ID: slots[i].id, Epoch: slots[i].epoch})
	}
	return log
}

const benchActive = 5000

// BenchmarkProjectorCatchUp: a fresh Projector over b.N events while a
// caller waits in CatchUp, as a new leader does before its term.started.
func BenchmarkProjectorCatchUp(b *testing.B) {
	log := benchLog(b, b.N, benchActive)
	tail, _ := log.Tail(context.Background())
	b.ReportAllocs()
	b.ResetTimer()
	p := view.NewProjector(log, zerolog.Nop(), nil)
	ctx, stop := startProjector(context.Background(), p)
	_, err := p.CatchUp(ctx)
	b.StopTimer()
	stop()
	if err != nil || p.Seq() != tail {
		b.Fatalf("caught up to %d of %d: %v", p.Seq(), tail, err)
	}
	b.ReportMetric(float64(tail)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkProjectorFollow: the same with nobody waiting (a follower), the
// test polling Seq every millisecond.
func BenchmarkProjectorFollow(b *testing.B) {
	log := benchLog(b, b.N, benchActive)
	tail, _ := log.Tail(context.Background())
	b.ReportAllocs()
	b.ResetTimer()
	p := view.NewProjector(log, zerolog.Nop(), nil)
	_, stop := startProjector(context.Background(), p)
	for p.Seq() < tail {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	stop()
	b.ReportMetric(float64(tail)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkLoad: view.Load, the one-shot fold status and worker list use.
func BenchmarkLoad(b *testing.B) {
	log := benchLog(b, b.N, benchActive)
	b.ReportAllocs()
	b.ResetTimer()
	st, err := view.Load(context.Background(), log)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if st.Counters.Applied != st.Seq {
		b.Fatalf("load: %+v", st.Counters)
	}
	b.ReportMetric(float64(st.Seq)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkCatchUpSnapshot: a new replica's Projector catching up with a
// 100,000-event stream (the generated mix), from a snapshot 9,999 events
// behind the tail (the worst case with the default snapshot interval) and
// from seq 1. One op is one fresh projector from start to caught up.
func BenchmarkCatchUpSnapshot(b *testing.B) {
	const m, tail = 100_000, 9_999
	mix, err := eventgen.Mix(m, 10_000)
	if err != nil {
		b.Fatal(err)
	}
	log := events.NewMemLog()
	if _, err := log.Append(context.Background(), 0, mix.Events...); err != nil {
		b.Fatal(err)
	}
	st := projections.New()
	for _, ev := range mix.Events[:m-tail] {
		st.Apply(ev)
	}
	store := events.NewMemSnapshots(log)
	data, si := st.StoredSnapshot()
	if _, err := store.Put(context.Background(), si, data); err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, folded uint64, opts ...view.ProjectorOption) {
		b.ReportAllocs()
		for b.Loop() {
			p := view.NewProjector(log, zerolog.Nop(), nil, opts...)
			ctx, stop := startProjector(context.Background(), p)
			_, err := p.CatchUp(ctx)
			stop()
			if o := p.Origin(); err != nil || o.Folded != folded {
				b.Fatalf("caught up folding %d events, want %d: %v", o.Folded, folded, err)
			}
		}
		b.ReportMetric(float64(m)*float64(b.N)/b.Elapsed().Seconds(), "stream-events/s")
	}
	b.Run("snapshot", func(b *testing.B) { run(b, tail, view.WithSnapshots(store)) })
	b.Run("full", func(b *testing.B) { run(b, m) })
}
