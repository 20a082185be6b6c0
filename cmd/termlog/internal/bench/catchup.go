package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// catchUp measures a new replica joining the stream of the workload: a
// fresh view.Projector catching up to the tail from a snapshot (the
// newest a leader with the default --snapshot-every would have stored at
// the worst moment: DefaultSnapshotEvery-1 events behind the tail), next to
// the same Projector folding from seq 1. Both end at the same hash.
func (r *run) catchUp(ctx context.Context) error {
	w, err := r.workload()
	if err != nil {
		return err
	}
	nc, _, log, err := r.replayLog(ctx, "catchup")
	if err != nil {
		return err
	}
	defer nc.Close()
	snaps, err := natslog.OpenSnapshots(ctx, log)
	if err != nil {
		return err
	}
	n := len(w.events)
	bound := r.cfg.PhaseTimeout
	tailEvents := min(n-1, meta.DefaultSnapshotEvery-1)
	cut := n - tailEvents

	// What the leader does: fold, encode, store.
	prefix := projections.New()
	for _, ev := range w.events[:cut] {
		prefix.Apply(ev)
	}
	full := prefix.Clone()
	for _, ev := range w.events[cut:] {
		full.Apply(ev)
	}
	want := full.Hash()
	encStart := time.Now()
	data, si := prefix.StoredSnapshot()
	encTook := time.Since(encStart)
	snapBytes := len(data)
	putStart := time.Now()
	si.Writer = "bench"
	si, err = snaps.Put(ctx, si, data)
	if err != nil {
		return fmt.Errorf("store snapshot: %w", err)
	}
	putTook := time.Since(putStart)
	r.progress("catchup: snapshot at seq %d of %d: %d KB, encoded in %s, stored in %s", si.Seq, n, len(data)>>10,
		encTook.Round(time.Millisecond), putTook.Round(time.Millisecond))

	runtime.GC()
	var with catchUpResult
	r.profile("catchup.snapshot", func() { with, err = projectorCatchUp(ctx, log, n, bound, true, view.WithSnapshots(snaps)) })
	if err != nil {
		return err
	}
	if !with.partial {
		if with.origin.Snapshot == nil || with.origin.Snapshot.Seq != si.Seq || with.origin.Folded != uint64(tailEvents) {
			return fmt.Errorf("catch-up from the snapshot at %d: origin %+v, want %d events folded", si.Seq, with.origin, tailEvents)
		}
		if h := with.state.Hash(); h != want {
			return fmt.Errorf("catch-up from the snapshot: hash %s, the fold from seq 1 %s", h, want)
		}
	}

	// The best moment: a snapshot at the tail (the one stored on a clean
	// shutdown).
	data, tsi := full.StoredSnapshot()
	tsi.Writer = "bench"
	tsi, err = snaps.Put(ctx, tsi, data)
	if err != nil {
		return fmt.Errorf("store snapshot: %w", err)
	}
	runtime.GC()
	atTail, err := projectorCatchUp(ctx, log, n, bound, true, view.WithSnapshots(snaps))
	if err != nil {
		return err
	}
	if !atTail.partial {
		// at_tail_s must time a start from that snapshot, not a full fold.
		if atTail.origin.Snapshot == nil || atTail.origin.Snapshot.Seq != tsi.Seq || atTail.origin.Folded != 0 {
			return fmt.Errorf("catch-up from the snapshot at the tail (%d): origin %+v, want it and no event folded", tsi.Seq, atTail.origin)
		}
		if h := atTail.state.Hash(); h != want {
			return fmt.Errorf("catch-up from the snapshot at the tail: hash %s, the fold from seq 1 %s", h, want)
		}
	}
	for _, name := range []string{si.Name, tsi.Name} {
		if err := snaps.Delete(ctx, name); err != nil {
			return err
		}
	}

	runtime.GC()
	var without catchUpResult
	r.profile("catchup.full", func() { without, err = projectorCatchUp(ctx, log, n, bound, true) })
	if err != nil {
		return err
	}
	if !without.partial && without.state.Hash() != want {
		return fmt.Errorf("catch-up from seq 1: hash %s, want %s", without.state.Hash(), want)
	}
	f := Figure{
		Name: "catchup.snapshot",
		What: fmt.Sprintf("a new replica's view.Projector from start to caught up with the %d-event stream, starting from a snapshot %d events behind the tail (the worst case with --snapshot-every %d; %d KB): find + read + decode + verify it, then fold the tail",
			n, tailEvents, meta.DefaultSnapshotEvery, snapBytes>>10),
		Unit: "s", Value: with.took.Seconds(), Baseline: without.took.Seconds(),
		BaselineWhat: fmt.Sprintf("the same Projector folding all %d events from seq 1 (no snapshot)", n),
		Target:       &Target{Of: "value", Op: "<=", Limit: 1, Text: "< 1 s with a snapshot"},
		Partial:      with.partial || without.partial,
		Extra: map[string]float64{
			"snapshot_load_s":         with.origin.LoadTook.Seconds(),
			"tail_events":             float64(with.origin.Folded),
			"snapshot_bytes":          float64(snapBytes),
			"encode_s":                encTook.Seconds(),
			"store_s":                 putTook.Seconds(),
			"at_tail_s":               atTail.took.Seconds(),
			"without_events_per_s":    float64(without.seq) / without.took.Seconds(),
			"with_vs_without_speedup": without.took.Seconds() / with.took.Seconds(),
		},
	}
	if f.Partial {
		f.Note = fmt.Sprintf("stopped by the %s bound (with snapshot at seq %d, without at seq %d of %d)", bound, with.seq, without.seq, n)
	} else {
		f.Note = fmt.Sprintf("from a snapshot at the tail: %.3f s", atTail.took.Seconds())
	}
	r.add(f)
	return nil
}
