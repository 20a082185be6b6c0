package view

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/projections"
)

// ProjectorOption configures a Projector.
type ProjectorOption func(*Projector)

// WithSnapshots makes Run start from the newest usable snapshot in store
// (at or below the stream's last seq) and fold only the events after it,
// when the projector starts from an empty state. A snapshot that does not
// decode, whose hash does not match, that was taken from another stream or
// whose following events were compacted away is passed over with a warning;
// with none usable, Run folds from seq 1. A nil store is no option.
func WithSnapshots(store events.SnapshotStore) ProjectorOption {
	return func(p *Projector) { p.snaps = store }
}

// Origin says where a projector's fold started: the provenance of its view
// beyond the seq, term and time the state itself records.
type Origin struct {
	// Snapshot is the snapshot the fold started from; nil when it started
	// from the state given to the constructor (empty: seq 1).
	Snapshot *events.SnapshotInfo `json:"snapshot,omitempty"`
	// Folded counts the records Run folded (the tail after the snapshot).
	Folded uint64 `json:"folded"`
	// LoadTook is how long finding and decoding the snapshot took.
	LoadTook time.Duration `json:"load_took"`
}

// Origin returns where the fold started and how much it folded since.
func (p *Projector) Origin() Origin {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.origin
	if o.Snapshot != nil {
		si := *o.Snapshot
		o.Snapshot = &si
	}
	return o
}

// startFromSnapshot replaces an empty state with the newest usable
// snapshot, once, before the first read of the log.
func (p *Projector) startFromSnapshot(ctx context.Context) {
	p.mu.Lock()
	store := p.snaps
	p.snaps = nil // once
	fresh := p.state.Seq == 0
	p.mu.Unlock()
	if store == nil || !fresh {
		return
	}
	st, si, took := findSnapshot(ctx, store, p.logger, p.clock.Now)
	if st == nil {
		return
	}
	p.mu.Lock()
	p.state = st
	p.view = nil
	p.origin.Snapshot = si
	p.origin.LoadTook = took
	p.healthy, p.lastErr = true, nil // the stream was just read
	p.notify()
	p.release()
	p.mu.Unlock()
}

// findSnapshot loads the newest usable snapshot of store, logging every
// snapshot passed over as a warning; nil when there is none.
func findSnapshot(ctx context.Context, store events.SnapshotStore, lg zerolog.Logger, now func() time.Time) (*projections.State, *events.SnapshotInfo, time.Duration) {
	start := now()
	st, si, skipped, err := events.LoadSnapshot(ctx, store, 0, projections.RulesVersion, projections.DecodeStoredSnapshot)
	for _, s := range skipped {
		lg.Warn().Err(s).Msg("snapshot ignored")
	}
	switch {
	case errors.Is(err, events.ErrNoSnapshot):
		lg.Debug().Str("why", err.Error()).Msg("no snapshot to start from; folding from seq 1")
		return nil, nil, 0
	case err != nil:
		if ctx.Err() == nil {
			lg.Warn().Err(err).Msg("snapshots unreadable; folding from seq 1")
		}
		return nil, nil, 0
	}
	took := now().Sub(start)
	lg.Info().Str("snapshot", si.Name).Uint64("seq", si.Seq).Uint64("term", si.Term).Str("hash", si.Hash).
		Str("writer", si.Writer).Int("bytes", si.Size).Dur("took", took).Msg("projection starts from a snapshot")
	return st, &si, took
}

// LoadFrom is Load starting from the newest usable snapshot in store (each
// one passed over is logged as a warning), folding only the events after
// it; with store nil or no usable snapshot, from seq 1. The origin says
// which; its LoadTook is measured on clk (nil: the wall clock).
func LoadFrom(ctx context.Context, log events.Log, store events.SnapshotStore, lg zerolog.Logger, clk clock.Clock) (*projections.State, Origin, error) {
	var o Origin
	st := projections.New()
	if clk == nil {
		clk = clock.Real{}
	}
	if store != nil {
		if s, si, took := findSnapshot(ctx, store, lg, clk.Now); s != nil {
			st, o.Snapshot, o.LoadTook = s, si, took
		}
	}
	fold := func(rec events.Record) error {
		st.ApplyRecord(rec)
		o.Folded++
		return nil
	}
	err := log.Read(ctx, st.Seq+1, fold)
	if o.Snapshot != nil && o.Folded == 0 && errors.Is(err, events.ErrCompacted) {
		lg.Warn().Err(err).Str("snapshot", o.Snapshot.Name).Msg("the events after the snapshot are gone; folding from seq 1")
		st, o = projections.New(), Origin{}
		err = log.Read(ctx, 1, fold)
	}
	if err != nil {
		return nil, o, errors.Join(ErrNotProjected, err)
	}
	return st, o, nil
}
