package meta

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/view"
)

// Snapshot defaults.
const (
	// DefaultSnapshotEvery keeps the tail a new replica folds after the
	// newest snapshot under 10,000 events (well under a second).
	DefaultSnapshotEvery = 10_000
	// DefaultSnapshotKeep snapshots are kept: the newest is used, the
	// older ones are there when the newest cannot be read.
	DefaultSnapshotKeep = 3
	snapshotRetryMin    = 250 * time.Millisecond
	snapshotRetryMax    = 10 * time.Second
)

func projectorOptions(cfg Config) []view.ProjectorOption {
	if cfg.Snapshots == nil {
		return nil
	}
	return []view.ProjectorOption{view.WithSnapshots(cfg.Snapshots)}
}

// snapshotDuty stores the term's snapshots (snapshotLoop, finalSnapshot).
type snapshotDuty struct {
	cfg    *Config
	proj   *view.Projector
	term   uint64
	logger zerolog.Logger
}

// snapshotLoop stores a snapshot of the replica's own projection every
// SnapshotEvery events while the term lasts (ctx), and returns the seq of
// the newest snapshot it knows stored (for finalSnapshot). It is a leader
// goroutine like the others: lead cancels and joins it. It sleeps until the
// projection reaches the next snapshot's seq (AwaitSeq: woken once, not on
// every event), and with periodic snapshots off until the term ends. It
// never holds up a decision: it copies the view (the projector's View, made
// under its lock) and encodes and stores the copy outside it. It only ever
// writes a state this replica folded from the stream, stamped with the seq,
// term and hash of that state and the writer's id and term.
func (sn *snapshotDuty) snapshotLoop(ctx context.Context) (last uint64) {
	cfg := sn.cfg
	if o := sn.proj.Origin(); o.Snapshot != nil {
		last = o.Snapshot.Seq
	}
	if cfg.SnapshotEvery <= 0 || cfg.Snapshots == nil {
		<-ctx.Done()
		return last
	}
	backoff := snapshotRetryMin
	for {
		if err := sn.proj.AwaitSeq(ctx, last+uint64(cfg.SnapshotEvery)); err != nil {
			return last
		}
		si, err := sn.writeSnapshot(ctx)
		if err == nil {
			last, backoff = si.Seq, snapshotRetryMin
			continue
		}
		if ctx.Err() != nil {
			return last
		}
		sn.logger.Warn().Err(err).Dur("retry_in", backoff).Msg("snapshot not stored")
		select {
		case <-ctx.Done():
			return last
		case <-cfg.Clock.After(backoff):
		}
		backoff = min(2*backoff, snapshotRetryMax)
	}
}

// finalSnapshot stores a snapshot of the replica's view when it shuts down
// cleanly, unless the newest one it stored (last) is of that view already.
// lead calls it after the term's other tasks are joined and before it
// releases the lease: only a leader writes (and prunes) snapshots. It is
// bounded by the lease the term still holds by its own rule (the watchdog's
// lease*2/3 after the last renewal, renewed at) and by lease/3, so shutdown
// waits at most that long for it; when nothing is left it is skipped.
func (sn *snapshotDuty) finalSnapshot(ctx context.Context, last uint64, renewed time.Time) {
	cfg := sn.cfg
	if cfg.Snapshots == nil || sn.proj.Seq() <= last {
		return
	}
	left := min(cfg.LeaseTTL*2/3-cfg.Clock.Now().Sub(renewed), cfg.LeaseTTL/3)
	if left <= 0 {
		sn.logger.Warn().Msg("snapshot on shutdown skipped: the lease may have lapsed")
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), left)
	defer cancel()
	if _, err := sn.writeSnapshot(fctx); err != nil {
		sn.logger.Warn().Err(err).Msg("snapshot on shutdown not stored")
	}
}

// writeSnapshot stores a snapshot of the current view and prunes old ones.
func (sn *snapshotDuty) writeSnapshot(ctx context.Context) (events.SnapshotInfo, error) {
	cfg := sn.cfg
	start := cfg.Clock.Now()
	v := sn.proj.View()
	if v.Seq == 0 {
		return events.SnapshotInfo{}, nil
	}
	data, si := v.StoredSnapshot()
	si.Writer, si.LeaderTerm, si.At = cfg.ID, sn.term, start.UTC()
	si, err := cfg.Snapshots.Put(ctx, si, data)
	if err != nil {
		return events.SnapshotInfo{}, fmt.Errorf("store snapshot at seq %d: %w", v.Seq, err)
	}
	pruned, err := events.PruneSnapshots(ctx, cfg.Snapshots, cfg.SnapshotKeep)
	if err != nil {
		sn.logger.Warn().Err(err).Msg("old snapshots not pruned")
	}
	sn.logger.Info().Str("snapshot", si.Name).Uint64("seq", si.Seq).Uint64("state_term", si.Term).Str("hash", si.Hash).
		Int("bytes", len(data)).Int("pruned", pruned).Dur("took", cfg.Clock.Now().Sub(start)).Msg("snapshot stored")
	return si, nil
}
