package logstore

import (
	"cmp"
	"maps"
	"slices"

	"github.com/lni/dragonboat/v4"

	"github.com/termlog/termlog/projections"
)

// ShardInfo is what the local NodeHost knows about one running replica: what
// the store heartbeats to meta.
type ShardInfo struct {
	Shard     uint64            `json:"shard"`
	Replica   uint64            `json:"replica"`
	Replicas  map[uint64]string `json:"replicas"` // replica id -> raft address, as this replica knows it
	Leader    uint64            `json:"leader"`   // 0 when unknown
	Term      uint64            `json:"term"`
	CCID      uint64            `json:"ccid"` // index of the last applied config change
	Pending   bool              `json:"pending,omitempty"`
	NonVoting bool              `json:"non_voting,omitempty"`
	Witness   bool              `json:"witness,omitempty"`
}

func (h *Host) shardInfoList() []dragonboat.ShardInfo {
	nh, release := h.acquire()
	defer release()
	nhi := nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if nhi == nil { // closed
		return nil
	}
	return nhi.ShardInfoList
}

// ShardInfos returns the running replicas ordered by shard.
func (h *Host) ShardInfos() []ShardInfo {
	list := h.shardInfoList()
	out := make([]ShardInfo, 0, len(list))
	for _, si := range list {
		out = append(out, ShardInfo{
			Shard:     si.ShardID,
			Replica:   si.ReplicaID,
			Replicas:  maps.Clone(si.Replicas),
			Leader:    si.LeaderID,
			Term:      si.Term,
			CCID:      si.ConfigChangeIndex,
			Pending:   si.Pending,
			NonVoting: si.IsNonVoting,
			Witness:   si.IsWitness,
		})
	}
	slices.SortFunc(out, func(a, b ShardInfo) int { return cmp.Compare(a.Shard, b.Shard) })
	return out
}

// Running reports whether the replica is loaded in the NodeHost.
func (h *Host) Running(shard, replica uint64) bool {
	r, ok := h.runningReplica(shard)
	return ok && r == replica
}

// Persisted returns the replicas that have a bootstrap record (and so local
// data) on this NodeHost, running or not, ordered by shard then replica.
func (h *Host) Persisted() []projections.ReplicaRef {
	nh, release := h.acquire()
	defer release()
	nhi := nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: false})
	if nhi == nil {
		return nil
	}
	out := make([]projections.ReplicaRef, 0, len(nhi.LogInfo))
	for _, ni := range nhi.LogInfo {
		out = append(out, projections.ReplicaRef{Shard: ni.ShardID, Replica: ni.ReplicaID})
	}
	sortRefs(out)
	return slices.Compact(out)
}

// Local is what the NodeHost has, the input of Plan.
func (h *Host) Local() Local {
	var l Local
	for _, si := range h.shardInfoList() {
		l.Running = append(l.Running, projections.ReplicaRef{Shard: si.ShardID, Replica: si.ReplicaID})
	}
	sortRefs(l.Running)
	l.Persisted = h.Persisted()
	l.Rebuilt = h.rebuilt()
	return l
}

func sortRefs(refs []projections.ReplicaRef) {
	slices.SortFunc(refs, compareRefs)
}

func compareRefs(a, b projections.ReplicaRef) int {
	if c := cmp.Compare(a.Shard, b.Shard); c != 0 {
		return c
	}
	return cmp.Compare(a.Replica, b.Replica)
}
