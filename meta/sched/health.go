package sched

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
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
	// Collecting lists the stores this leader has not heard from yet in
	// its term (a new leader gives each a store timeout): until they
	// report, the shards they serve say "collecting reports", not 0/3.
	Collecting []string `json:"collecting,omitempty"`
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
	// LostQuorum: fewer members run on live stores than a quorum, and
	// have since QuorumShortSince for longer than the threshold
	// (Config.LostQuorumAfter). Raft cannot commit or read; only an
	// operator's recovery (Runbook) rebuilds the shard.
	LostQuorum       bool      `json:"lost_quorum,omitempty"`
	QuorumShortSince time.Time `json:"quorum_short_since,omitzero"`
	// Gone are the members not running on a live store, "replica@store
	// (state)", while the quorum is short.
	Gone    []string `json:"gone,omitempty"`
	Runbook string   `json:"runbook,omitempty"` // the command to run, when LostQuorum
	Healthy bool     `json:"healthy"`
	Why     string   `json:"why,omitempty"` // why not healthy
}

// StoreHealth is one store's health.
type StoreHealth struct {
	Store         string    `json:"store"`
	State         string    `json:"state"`
	Live          bool      `json:"live"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"` // zero: none this term
	Until         time.Time `json:"until,omitzero"`          // draining deadline
	Replicas      int       `json:"replicas"`                // running, as it reports
	// Incarnation is the process whose report this is (empty: no report
	// of the registered process this term); Started its start, as it
	// says. A reader whose projection has another incarnation registered
	// knows the record predates the store's restart.
	Incarnation string    `json:"incarnation,omitempty"`
	Started     time.Time `json:"started,omitzero"`
	// Stopped: the registered process announced its own stop (SIGTERM)
	// at StoppedAt; it counts as gone.
	Stopped   bool      `json:"stopped,omitempty"`
	StoppedAt time.Time `json:"stopped_at,omitzero"`
}

func (d *decider) health() Health {
	h := Health{Seq: d.v.Seq, Term: d.in.Term, At: d.in.Now, ShardsWanted: d.in.Config.Shards}
	for _, st := range d.v.ListStores() {
		sh := StoreHealth{Store: st.ID, State: st.State, Live: d.live[st.ID], Until: st.Until}
		if rep, ok := d.in.Reports[st.ID]; ok && rep.Incarnation == st.Incarnation {
			sh.LastHeartbeat = rep.At
			sh.Replicas = len(rep.Shards)
			sh.Incarnation, sh.Started = rep.Incarnation, rep.Started
		}
		if st.PlannedStop() {
			sh.Stopped, sh.StoppedAt, sh.Replicas = true, st.StoppedAt, 0
		}
		if st.State != events.StoreDown && st.State != events.StoreTombstone && !st.PlannedStop() && d.unheard(st.ID) {
			h.Collecting = append(h.Collecting, st.ID)
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
		var collecting []string
		for _, store := range sv.unheard {
			if st := d.v.Stores[store]; st != nil && !st.PlannedStop() {
				collecting = append(collecting, store)
			}
		}
		d.quorumClock(sh, sv, &x)
		switch {
		case x.LostQuorum:
			x.Why = lostQuorumWhy(x, d.in.Now)
		case x.Live < x.Expected && len(collecting) > 0:
			// A new leader has not heard from these stores yet: it does
			// not know, rather than 0/3.
			x.Why = fmt.Sprintf("collecting reports (%d/%d replicas running so far; not heard from %s yet this term)", x.Live, x.Expected, strings.Join(collecting, ", "))
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

// RecoverCommand is the runbook's command for a shard that lost quorum:
// its dry run, from the store of a running member (from "" names none).
func RecoverCommand(shard uint64, from string) string {
	if from == "" {
		from = "<store holding the shard>"
	}
	return fmt.Sprintf("termlog shard recover --shard %d --from %s --dry-run", shard, from)
}

// quorumClock keeps the shard's quorum clock in the memory and sets
// LostQuorum, QuorumShortSince, Gone and Runbook on x: the shard lost
// quorum once fewer of its members than a quorum have been running on
// live stores for Config.LostQuorumAfter.
func (d *decider) quorumClock(sh *projections.Shard, sv shardView, x *ShardHealth) {
	m := d.mem.shard(sh.ID)
	short := len(sh.Members) > 0 && x.Live < quorum(len(sh.Members))
	if sv.raft != nil && sv.raft.CCID > sh.CCID {
		// Raft moved past the log (an outcome not recorded yet): its own
		// membership is what needs the quorum.
		n := 0
		for _, r := range x.Running {
			if _, ok := sv.raft.Replicas[r]; ok {
				n++
			}
		}
		if n < quorum(len(sv.raft.Replicas)) {
			short = true
		}
	}
	if !short {
		if !m.shortSince.IsZero() {
			m.shortSince = time.Time{}
			d.mem.set(sh.ID, m)
		}
		return
	}
	if m.shortSince.IsZero() {
		m.shortSince = d.in.Now
		d.mem.set(sh.ID, m)
	}
	x.QuorumShortSince = m.shortSince
	running := map[uint64]bool{}
	for _, r := range x.Running {
		running[r] = true
	}
	for _, r := range sortedIDs(sh.Members) {
		if running[r] {
			continue
		}
		st := sh.Members[r]
		state := "not running"
		if s := d.v.Stores[st]; s == nil {
			state = "unknown store"
		} else if !d.live[st] {
			state = s.State + ", silent"
			if s.State == events.StoreDown {
				state = fmt.Sprintf("down since seq %d", s.Since)
			}
		}
		x.Gone = append(x.Gone, fmt.Sprintf("%d@%s (%s)", r, st, state))
	}
	if d.in.Now.Sub(m.shortSince) < d.in.Config.LostQuorumAfter {
		return
	}
	x.LostQuorum = true
	from := ""
	if len(x.Running) > 0 {
		from = sh.Members[x.Running[0]]
	}
	x.Runbook = RecoverCommand(sh.ID, from)
}

func lostQuorumWhy(x ShardHealth, now time.Time) string {
	return fmt.Sprintf("lost-quorum: %d of %d members running on live stores (a quorum is %d) since %s (%s); gone: %s; Raft can neither commit nor read: recover with %s",
		x.Live, len(x.Members), quorum(len(x.Members)), x.QuorumShortSince.UTC().Format(time.RFC3339), now.Sub(x.QuorumShortSince).Round(time.Second),
		strings.Join(x.Gone, ", "), x.Runbook)
}
