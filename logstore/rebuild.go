package logstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/tools"

	"github.com/termlog/termlog/projections"
)

// Applied is the Raft index up to which this store's replica of shard has
// applied the log, read from its own state (no quorum needed): what a
// recovery from this replica keeps. It is the last entry its state machine
// applied since it started, or the index of its latest snapshot when
// nothing was applied since. ok is false when no replica of shard runs here.
func (h *Host) Applied(shard uint64) (replica, applied uint64, ok bool) {
	r, running := h.runningReplica(shard)
	if !running {
		return 0, 0, false
	}
	nh, release := h.acquire()
	defer release()
	if v, err := nh.StaleRead(shard, appliedQuery{}); err == nil {
		applied, _ = v.(uint64)
	}
	if reader, err := nh.GetLogReader(shard); err == nil {
		applied = max(applied, reader.Snapshot().Index)
	}
	return r, applied, true
}

// Rebuild makes shard a one-member shard {replica: this NodeHost} from this
// store's own replica, for an operator's recovery of a shard that lost its
// quorum for good (shard.recovered). It exports a snapshot of the replica's
// applied state, closes the NodeHost, imports the snapshot with the new
// membership (dragonboat's tools.ImportSnapshot: every other member is
// marked removed in Raft itself), reopens the NodeHost on the same
// directories and restarts every replica that ran before. It returns the
// Raft index of the snapshot (the recovered state). The replica must run or
// have local data here.
func (h *Host) Rebuild(ctx context.Context, shard, replica uint64) (uint64, error) {
	return h.rebuild(ctx, shard, replica, nil)
}

// rebuiltFile records, per shard, the seq of the last shard.recovered this
// store carried out: written right after the import, so that a recovery is
// carried out once (a second import would drop replicas added since).
const rebuiltFile = "rebuilt.json"

// rebuilt reads rebuiltFile (nil when there is none).
func (h *Host) rebuilt() map[uint64]uint64 {
	b, err := os.ReadFile(filepath.Join(h.cfg.DataDir, rebuiltFile))
	if err != nil {
		return nil
	}
	var m map[uint64]uint64
	if json.Unmarshal(b, &m) != nil {
		h.logger.Error().Str("file", rebuiltFile).Msg("corrupt record of carried-out recoveries; ignoring it")
		return nil
	}
	return m
}

// rebuildFor carries out the recovery recorded at seq (ActRebuild).
func (h *Host) rebuildFor(ctx context.Context, shard, replica, seq uint64) (uint64, error) {
	return h.rebuild(ctx, shard, replica, func() error {
		m := h.rebuilt()
		if m == nil {
			m = map[uint64]uint64{}
		}
		m[shard] = seq
		return writeFileAtomic(filepath.Join(h.cfg.DataDir, rebuiltFile), m)
	})
}

func (h *Host) rebuild(ctx context.Context, shard, replica uint64, afterImport func() error) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	nh := h.nodeHost()
	if r, ok := h.runningReplica(shard); ok && r != replica {
		return 0, fmt.Errorf("%w: shard %d runs replica %d, not %d", ErrOtherReplicaRunning, shard, r, replica)
	} else if !ok {
		if !nh.HasNodeInfo(shard, replica) {
			return 0, fmt.Errorf("logstore: rebuild shard %d from replica %d: no local data of it here", shard, replica)
		}
		if err := nh.StartReplica(nil, false, newLogSM, h.raftConfig(shard, replica)); err != nil {
			return 0, fmt.Errorf("logstore: rebuild shard %d: start replica %d from its data: %w", shard, replica, err)
		}
	}
	dir, err := os.MkdirTemp(h.cfg.DataDir, "rebuild-")
	if err != nil {
		return 0, fmt.Errorf("logstore: rebuild shard %d: %w", shard, err)
	}
	defer os.RemoveAll(dir)
	var index uint64
	for {
		index, err = nh.SyncRequestSnapshot(ctx, shard, dragonboat.SnapshotOption{Exported: true, ExportPath: dir})
		if err == nil {
			break
		}
		if !retryable(err) || ctx.Err() != nil {
			return 0, fmt.Errorf("logstore: rebuild shard %d: export a snapshot of replica %d: %w", shard, replica, err)
		}
		wait := h.rtt()
		if !h.sleepCtx(ctx, &wait) {
			return 0, fmt.Errorf("logstore: rebuild shard %d: export a snapshot of replica %d: %w", shard, replica, ctx.Err())
		}
	}
	src, err := exportedDir(dir)
	if err != nil {
		return 0, fmt.Errorf("logstore: rebuild shard %d: %w", shard, err)
	}
	var running []projections.ReplicaRef
	for _, si := range h.shardInfoList() {
		running = append(running, projections.ReplicaRef{Shard: si.ShardID, Replica: si.ReplicaID})
	}
	h.nhMu.Lock()
	nh.Close()
	importErr := tools.ImportSnapshot(h.nhc, src, map[uint64]string{replica: h.cfg.RaftAddr}, replica)
	if importErr == nil && afterImport != nil {
		importErr = afterImport()
	}
	reopened, err := dragonboat.NewNodeHost(h.nhc)
	if err == nil {
		h.nh.Store(reopened)
	}
	h.nhMu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("logstore: rebuild shard %d: reopen the NodeHost: %w (import: %v)", shard, err, importErr)
	}
	var restartErr error
	for _, ref := range running {
		if err := reopened.StartReplica(nil, false, newLogSM, h.raftConfig(ref.Shard, ref.Replica)); err != nil && restartErr == nil {
			restartErr = fmt.Errorf("logstore: rebuild shard %d: restart shard %d replica %d: %w", shard, ref.Shard, ref.Replica, err)
		}
	}
	if importErr != nil {
		return 0, fmt.Errorf("logstore: rebuild shard %d: import the snapshot at index %d: %w", shard, index, importErr)
	}
	h.logger.Warn().Uint64("shard", shard).Uint64("replica", replica).Uint64("index", index).Msg("shard rebuilt as a one-member shard from this replica (operator's recovery)")
	return index, restartErr
}

// exportedDir is the one snapshot directory an export wrote into dir.
func exportedDir(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.IsDir() {
			return filepath.Join(dir, e.Name()), nil
		}
	}
	return "", fmt.Errorf("no exported snapshot in %s", dir)
}
