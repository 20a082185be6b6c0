package sched

import (
	"fmt"
	"maps"
	"time"
)

// Health is the cluster's shard and store health as one decision saw it,
// with its provenance: the projected seq and term it was decided on and
// the leader's time.
type Health struct {
	Seq    uint64        `json:"seq"`
	Term   uint64        `json:"term"` // the deciding leader's term
	At     time.Time     `json:"at"`
	Shards []ShardHealth `json:"shards"`
	Stores []StoreHealth `json:"stores"`
	// ShardsWanted is how many shards the scheduler keeps (fewer exist
	// until enough live stores bootstrap them).
	ShardsWanted int `json:"shards_wanted"`
}

// ShardHealth is one shard's health: from the projection and the stores'
// reports, never from store-level state alone.
type ShardHealth struct {
	Shard       uint64            `json:"shard"`
	Expected    int               `json:"expected"`
	Members     map[uint64]string `json:"members"`                // projected: replica -> store
	RaftMembers map[uint64]string `json:"raft_members,omitempty"` // newest reported by Raft: replica -> address
	CCID        uint64            `json:"ccid"`
	Live        int               `json:"running"` // members running on live stores
	Running     []uint64          `json:"running_replicas,omitempty"`
	Leader      uint64            `json:"leader"`                 // Raft leader replica (0: none known)
	LeaderStore string            `json:"leader_store,omitempty"` // the store it runs on
	RaftTerm    uint64            `json:"raft_term,omitempty"`
	Pending     []string          `json:"pending,omitempty"` // "removing 3@store-3"
	Operator    string            `json:"operator,omitempty"`
	Step        string            `json:"step,omitempty"`
	Blocked     string            `json:"blocked,omitempty"`
	Zombies     []string          `json:"zombies,omitempty"` // replica@store refused to start
	LastError   string            `json:"last_error,omitempty"`
	Healthy     bool              `json:"healthy"`
	Why         string            `json:"why,omitempty"` // why not healthy
}

// StoreHealth is one store's health.
type StoreHealth struct {
	Store         string    `json:"store"`
	State         string    `json:"state"`
	Live          bool      `json:"live"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"` // zero: none this term
	Until         time.Time `json:"until,omitzero"`          // draining deadline
	Replicas      int       `json:"replicas"`                // running, as it reports
}

func (d *decider) health() Health {
	h := Health{Seq: d.v.Seq, Term: d.in.Term, At: d.in.Now, ShardsWanted: d.in.Config.Shards}
	for _, st := range d.v.ListStores() {
		sh := StoreHealth{Store: st.ID, State: st.State, Live: d.live[st.ID], Until: st.Until}
		if rep, ok := d.in.Reports[st.ID]; ok && rep.Incarnation == st.Incarnation {
			sh.LastHeartbeat = rep.At
			sh.Replicas = len(rep.Shards)
		}
		h.Stores = append(h.Stores, sh)
	}
	for _, id := range sortedIDs(d.v.Shards) {
		sh := d.v.Shards[id]
		sv := d.see(sh)
		m := d.mem.shard(id)
		x := ShardHealth{Shard: id, Expected: d.in.Config.Replicas, Members: maps.Clone(sh.Members), CCID: sh.CCID,
			Operator: sh.Operator, Blocked: sh.Blocked, Zombies: sv.zombies, LastError: m.lastErr, Leader: sh.Leader}
		for _, r := range sortedIDs(sh.Members) {
			if sv.running[r] {
				x.Running = append(x.Running, r)
			}
		}
		x.Live = len(x.Running)
		if sv.raft != nil {
			x.RaftMembers = maps.Clone(sv.raft.Replicas)
		}
		if sv.leader != nil && sh.IsMember(sv.leader.Leader) {
			x.Leader, x.RaftTerm = sv.leader.Leader, sv.leader.Term
		} else if len(x.Running) > 0 {
			x.Leader = 0 // the running members know no leader
		}
		if x.Leader != 0 {
			x.LeaderStore = sh.Members[x.Leader]
		}
		for _, r := range sortedIDs(sh.Pending) {
			p := sh.Pending[r]
			x.Pending = append(x.Pending, fmt.Sprintf("%s %d@%s", p.Kind, r, p.Store))
		}
		if op := d.v.Operators[sh.Operator]; op != nil {
			x.Step = m.step
			if op.Term != d.in.Term {
				x.Step = fmt.Sprintf("inherited from term %d", op.Term)
			}
		}
		switch {
		case x.Live < x.Expected:
			x.Why = fmt.Sprintf("%d/%d replicas running", x.Live, x.Expected)
		case len(sh.Members) != x.Expected:
			x.Why = fmt.Sprintf("%d members, %d expected", len(sh.Members), x.Expected)
		case x.Leader == 0:
			x.Why = "no raft leader"
		case x.Operator != "":
			x.Why = "operator " + x.Operator + " running"
		case len(x.Pending) > 0:
			x.Why = "pending change"
		case x.Blocked != "":
			x.Why = "blocked: " + x.Blocked
		}
		x.Healthy = x.Why == ""
		h.Shards = append(h.Shards, x)
	}
	return h
}
