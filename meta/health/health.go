// Package health is the one judge of a cluster's health: what `termlog
// status` prints and exits by, what `--wait-healthy` waits for and what the
// web console shows. It holds the Status that `status -o json` prints, the
// judge over it and the leader's published health record, and Assemble,
// which builds a judged Status from a projected state and the lease and
// health buckets as read. No I/O: its callers read the buckets.
package health

import (
	"fmt"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/judge"
	"github.com/termlog/termlog/projections"
)

// Status is what `termlog status --json` prints: read from the stream and
// the lease bucket, never from a leader RPC, so it works without a leader.
type Status struct {
	Cluster     string `json:"cluster"`
	LeaseHolder string `json:"lease_holder"`
	// LeaseError is why the lease bucket could not be read (LeaseHolder is
	// then unknown, not empty).
	LeaseError string                `json:"lease_error,omitempty"`
	Seq        uint64                `json:"seq"`
	Term       uint64                `json:"term"`
	TermLease  uint64                `json:"term_lease,omitempty"` // the term's fencing token: the lease revision its leader took
	Leader     string                `json:"leader"`
	At         time.Time             `json:"at"`
	Hash       string                `json:"hash"`
	Workers    []projections.Worker  `json:"workers"`
	Stores     []projections.Store   `json:"stores"`
	Shards     []projections.Shard   `json:"shards"`
	Counters   projections.Counters  `json:"counters"`
	Anomalies  []projections.Anomaly `json:"anomalies"`
	// FromSnapshot is the snapshot the fold started from (absent: seq 1).
	FromSnapshot *events.SnapshotInfo `json:"from_snapshot,omitempty"`
	// Health is the leader's published shard and store health, its age,
	// and what keeps the cluster from healthy.
	Health Health `json:"health"`
	// Stale, when set, says this status is not a read of the stream but a
	// copy (the leader's last health record) read while the stream's
	// leader did not answer: never healthy, exit 1.
	Stale *StaleCopy `json:"stale,omitempty"`
	// Stream is the event stream's NATS replicas as the stream's leader
	// sees them (absent: a single server, or no answer in time): which
	// node's copy is gone.
	Stream *StreamReplicas `json:"stream,omitempty"`
}

// StreamReplicas is the event stream's replicas as its leader answered a
// stream info.
type StreamReplicas struct {
	Stream string `json:"stream"`
	Leader string `json:"leader"`
	// Replicas are the other servers holding a copy (not the leader).
	Replicas []StreamReplica `json:"replicas"`
}

// StreamReplica is one server's copy of the event stream as the stream's
// leader sees it.
type StreamReplica struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	// LastSeenMS is how long ago the leader last heard from it (NATS Raft
	// heartbeats every second).
	LastSeenMS int64  `json:"last_seen_ms"`
	Lag        uint64 `json:"lag,omitempty"`
	// Unheard: the leader has not heard from it since it took over the
	// stream (a replica on the node the old leader died with); LastSeenMS
	// is then how long it has led.
	Unheard bool `json:"unheard,omitempty"`
	// Gone: the leader has not heard from it for ReplicaGoneAfter, or
	// knows its server offline (see Judge).
	Gone bool `json:"gone"`
}

// ReplicaGoneAfter is how long a replica of the event stream may be
// silent to its leader before status calls it gone: three of NATS Raft's
// one-second heartbeats missed. (The leader's own "current" stays true
// for up to 10 s after a follower died, while nothing was appended.)
const ReplicaGoneAfter = 3 * time.Second

// Judge marks each replica gone or not; the ones gone are returned by
// name. A gone replica is not a problem of the cluster's health (the
// stream keeps its quorum; status's exit is termlog's state): status
// names it so an operator knows which node to look at.
func (r *StreamReplicas) Judge() (gone []string) {
	if r == nil {
		return nil
	}
	for i := range r.Replicas {
		rp := &r.Replicas[i]
		rp.Gone = rp.Offline || time.Duration(rp.LastSeenMS)*time.Millisecond >= ReplicaGoneAfter
		if rp.Gone {
			gone = append(gone, rp.Name)
		}
	}
	return gone
}

// String is the replicas line of status's table.
func (r *StreamReplicas) String() string {
	line := fmt.Sprintf("event stream %s: leader %s", r.Stream, r.Leader)
	for _, rp := range r.Replicas {
		seen := (time.Duration(rp.LastSeenMS) * time.Millisecond).Round(100 * time.Millisecond)
		switch {
		case rp.Gone && rp.Offline:
			line += fmt.Sprintf(", %s GONE (offline, last heard %s ago)", rp.Name, seen)
		case rp.Gone && rp.Unheard:
			line += fmt.Sprintf(", %s GONE (not heard from since this leader took over, %s ago)", rp.Name, seen)
		case rp.Gone:
			line += fmt.Sprintf(", %s GONE (not heard from for %s)", rp.Name, seen)
		case !rp.Current:
			line += fmt.Sprintf(", %s behind (lag %d)", rp.Name, rp.Lag)
		default:
			line += ", " + rp.Name + " current"
		}
	}
	return line
}

// StaleCopy is why a status is not a read of the stream: it was answered from
// a copy any replica serves (the health record the meta leader published,
// and the lease), because the event stream's leader did not answer.
type StaleCopy struct {
	Reason string `json:"reason"`
	// Seq is the projected seq of the copy: state as of that seq.
	Seq uint64 `json:"seq"`
	// Source names the copy and the server it was read through.
	Source string `json:"source"`
	// AgeMS is the copy's age when read (the leader's clock).
	AgeMS int64 `json:"age_ms"`
}

func (s *StaleCopy) String() string {
	return fmt.Sprintf("STALE: %s; state as of seq %d from %s (%s old)", s.Reason, s.Seq, s.Source, (time.Duration(s.AgeMS) * time.Millisecond).Round(100*time.Millisecond))
}

// Copy is what a reader got from the copies any current replica serves
// (direct gets) while the event stream's read stalled: the meta leader's
// last health record and the lease holder as that replica holds them.
type Copy struct {
	Record meta.HealthRecord
	// Holder is the lease holder ("" none); LeaseErr, when set, is why it
	// could not be read (then it is unknown).
	Holder   string
	LeaseErr string
	// Via names the server the copies were read through.
	Via string
}

// AssembleStale is the Status of a copy, marked stale with why (what the
// read of the stream waited for), as of now: state as of the record's seq
// and term, never healthy (exit 1), the one problem being the marking.
func AssembleStale(cluster string, c Copy, why string, now time.Time) Status {
	rec := c.Record
	age := max(now.Sub(rec.At), 0)
	s := Status{Cluster: cluster, Seq: rec.Seq, Term: rec.Term, Leader: rec.Leader, At: rec.At,
		LeaseHolder: c.Holder, LeaseError: c.LeaseErr}
	via := c.Via
	if via == "" {
		via = "an unnamed server"
	}
	s.Stale = &StaleCopy{Reason: why, Seq: rec.Seq, AgeMS: age.Milliseconds(),
		Source: fmt.Sprintf("the health record of term %d by %s, read through %s", rec.Term, rec.Leader, via)}
	s.Health = Health{Record: &rec, AgeMS: age.Milliseconds(), Problems: []string{s.Stale.String()}}
	return s
}

// Health is the cluster's health as `status` judges it: the leader's
// published record (per shard, per store), its age, and the problems that
// make the cluster degraded. It is part of `status --json`.
type Health struct {
	Record   *meta.HealthRecord `json:"record,omitempty"` // nil: none published
	AgeMS    int64              `json:"age_ms"`           // age of the record when read
	Healthy  bool               `json:"healthy"`
	Problems []string           `json:"problems,omitempty"`
}

// Read is what a caller read from the lease and health buckets for
// Assemble: the lease holder ("" none) or why it could not be read, the
// lease bucket's TTL (0 unknown), and the health record (nil: none).
type Read struct {
	Holder   string
	LeaseErr error
	TTL      time.Duration
	Record   *meta.HealthRecord
}

// Assemble is the judged Status of the projected state st (folded from the
// snapshot snap, nil for seq 1) and what was read from the buckets, as of
// now: the one place `status` and the console build it.
func Assemble(cluster string, st *projections.State, snap *events.SnapshotInfo, r Read, now time.Time) Status {
	s := Status{
		Cluster: cluster, Seq: st.Seq, Term: st.Term, TermLease: st.Lease, Leader: st.Leader, At: st.At, Hash: st.Hash(),
		Workers: st.ListWorkers(), Stores: st.ListStores(), Shards: st.ListShards(), Counters: st.Counters, Anomalies: st.Anomalies,
		FromSnapshot: snap,
		LeaseHolder:  r.Holder,
	}
	if r.LeaseErr != nil {
		s.LeaseError = r.LeaseErr.Error()
	}
	lease := 3 * time.Second
	if r.TTL > 0 {
		lease = r.TTL
	}
	var age time.Duration
	if r.Record != nil {
		age = max(now.Sub(r.Record.At), 0)
	}
	s.Health = Health{Record: r.Record, AgeMS: age.Milliseconds(), Problems: Judge(s, r.Record, age, Stale(lease))}
	s.Health.Healthy = len(s.Health.Problems) == 0
	return s
}

// Stale is how old a health record may be before status says no
// leader is publishing: the leader rewrites it every second, and a new
// leader takes over within a lease.
func Stale(lease time.Duration) time.Duration { return lease + 3*time.Second }

// Judge lists what keeps the cluster from healthy: the one judge
// (package meta/judge) over what a reader gathered.
func Judge(s Status, rec *meta.HealthRecord, age, stale time.Duration) []string {
	return judge.Problems(judge.Input{Term: s.Term, LeaseHolder: s.LeaseHolder, LeaseError: s.LeaseError,
		Workers: s.Workers, Stores: s.Stores, Shards: s.Shards, Record: rec, Age: age, Stale: stale})
}
