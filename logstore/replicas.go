package logstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lni/dragonboat/v4"
	dbconfig "github.com/lni/dragonboat/v4/config"
)

// Errors of the replica lifecycle.
var (
	// ErrNotBootstrapped: the replica has no local bootstrap record, is not
	// joining and no initial members were given; starting it would panic in
	// dragonboat, so it is refused.
	ErrNotBootstrapped = errors.New("logstore: replica has no bootstrap record, no initial members and is not joining")
	// ErrOtherReplicaRunning: another replica of the same shard runs here.
	ErrOtherReplicaRunning = errors.New("logstore: another replica of the shard is running on this NodeHost")
	// ErrReplicaDataRemoved: the replica's data was removed on this NodeHost;
	// a removed replica id never starts again.
	ErrReplicaDataRemoved = errors.New("logstore: replica data was removed here; the id never starts again")
)

// raftConfig is the Raft config of every replica.
func (h *Host) raftConfig(shard, replica uint64) dbconfig.Config {
	return dbconfig.Config{
		ShardID:             shard,
		ReplicaID:           replica,
		PreVote:             true,
		CheckQuorum:         true,
		OrderedConfigChange: true,
		ElectionRTT:         h.cfg.ElectionRTT,
		HeartbeatRTT:        h.cfg.HeartbeatRTT,
		SnapshotEntries:     h.cfg.SnapshotEntries,
		CompactionOverhead:  h.cfg.CompactionOverhead,
	}
}

// startMember is the only place StartReplica is called. It never asks
// dragonboat to do something that panics:
//   - a replica with a local bootstrap record restarts from its data;
//   - otherwise a joining replica (added to a running shard) starts empty
//     and waits for the leader;
//   - otherwise a replica of the shard's initial membership bootstraps with
//     initialMembers {replica id: raft address};
//   - anything else is refused with ErrNotBootstrapped.
//
// Callers decide whether the replica may run at all (Plan): startMember only
// decides how.
func (h *Host) startMember(shard, replica uint64, initialMembers map[uint64]string, join bool) error {
	if shard == 0 || replica == 0 {
		return fmt.Errorf("logstore: start shard %d replica %d: ids must be non-zero", shard, replica)
	}
	if join && len(initialMembers) > 0 {
		return fmt.Errorf("logstore: start shard %d replica %d: a joining replica takes no initial members", shard, replica)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.runningReplica(shard); ok {
		if r == replica {
			return nil
		}
		return fmt.Errorf("%w: shard %d runs replica %d, wanted %d", ErrOtherReplicaRunning, shard, r, replica)
	}
	cfg := h.raftConfig(shard, replica)
	var (
		err  error
		mode string
	)
	switch {
	case h.nodeHost().HasNodeInfo(shard, replica):
		mode = "restart"
		err = h.nodeHost().StartReplica(nil, false, newLogSM, cfg)
	case join:
		mode = "join"
		err = h.nodeHost().StartReplica(nil, true, newLogSM, cfg)
	case len(initialMembers) > 0:
		addr, ok := initialMembers[replica]
		if !ok {
			return fmt.Errorf("logstore: bootstrap shard %d replica %d: not among the initial members %v", shard, replica, initialMembers)
		}
		if addr != h.cfg.RaftAddr {
			return fmt.Errorf("logstore: bootstrap shard %d replica %d: initial members place it at %s, this NodeHost is %s", shard, replica, addr, h.cfg.RaftAddr)
		}
		mode = "bootstrap"
		err = h.nodeHost().StartReplica(initialMembers, false, newLogSM, cfg)
	default:
		return fmt.Errorf("%w: shard %d replica %d", ErrNotBootstrapped, shard, replica)
	}
	if errors.Is(err, dragonboat.ErrReplicaRemoved) {
		// dragonboat saved a bootstrap record before it found the data dir
		// marked as deleted: drop that record again so that the replica
		// does not reappear as persisted.
		if rerr := h.nodeHost().RemoveData(shard, replica); rerr != nil {
			h.logger.Warn().Err(rerr).Uint64("shard", shard).Uint64("replica", replica).Msg("dropping the bootstrap record of a removed replica failed")
		}
		err = fmt.Errorf("%w: shard %d replica %d: %v", ErrReplicaDataRemoved, shard, replica, err)
	}
	if err != nil {
		return fmt.Errorf("logstore: %s shard %d replica %d: %w", mode, shard, replica, err)
	}
	h.logger.Info().Uint64("shard", shard).Uint64("replica", replica).Str("mode", mode).Msg("replica started")
	return nil
}

// runningReplica returns the replica of shard loaded in the NodeHost.
func (h *Host) runningReplica(shard uint64) (uint64, bool) {
	for _, si := range h.shardInfoList() {
		if si.ShardID == shard {
			return si.ReplicaID, true
		}
	}
	return 0, false
}

// stopMember stops the replica if it runs. Stopping is not a membership
// change.
func (h *Host) stopMember(shard, replica uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stopLocked(shard, replica)
}

func (h *Host) stopLocked(shard, replica uint64) error {
	err := h.nodeHost().StopReplica(shard, replica)
	if errors.Is(err, dragonboat.ErrShardNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logstore: stop shard %d replica %d: %w", shard, replica, err)
	}
	h.logger.Info().Uint64("shard", shard).Uint64("replica", replica).Msg("replica stopped")
	return nil
}

// removeData stops the replica if it runs, then removes its local data
// (log, bootstrap record, snapshots), waiting while dragonboat is still
// offloading it. Only for replicas that Raft has removed from their shard:
// removing a member's data corrupts the shard.
//
// dragonboat's SyncRemoveData panics if the replica is still loaded after
// its destroyed signal; RemoveData returns ErrShardNotStopped instead, so
// this polls RemoveData until it succeeds or ctx ends.
func (h *Host) removeData(ctx context.Context, shard, replica uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.stopLocked(shard, replica); err != nil {
		return err
	}
	wait := 5 * time.Millisecond
	for {
		err := h.nodeHost().RemoveData(shard, replica)
		if err == nil {
			h.logger.Info().Uint64("shard", shard).Uint64("replica", replica).Msg("replica data removed")
			return nil
		}
		if !errors.Is(err, dragonboat.ErrShardNotStopped) {
			return fmt.Errorf("logstore: remove data of shard %d replica %d: %w", shard, replica, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("logstore: remove data of shard %d replica %d: still offloading: %w", shard, replica, ctx.Err())
		case <-h.clock.After(wait):
		}
		wait = min(wait*2, 200*time.Millisecond)
	}
}
