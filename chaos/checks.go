package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// The checks are pure functions over what the runner collected from the
// outside. Each returns the violations it found (nil: none), so a test can
// feed it doctored data and watch it fail.

// Violation is one broken property.
type Violation struct {
	Check  string // which check
	Detail string
}

func (v Violation) String() string { return v.Check + ": " + v.Detail }

const (
	CheckLog      = "log-contiguous"
	CheckTerms    = "one-writer-per-term"
	CheckWorkers  = "workers"
	CheckShards   = "shards"
	CheckPanics   = "no-panic"
	CheckRecovery = "recovery"
	CheckHistory  = "history"
	CheckExits    = "no-exit"
	CheckStepDown = "cut-leader-stops"
)

// LogContiguous checks an export: seqs run 1, 2, 3... with no gap,
// swap or duplicate, no record is undecodable, and `replay --check` on the
// file exited 0.
func LogContiguous(evs []Event, replayCode int, replayOut string) []Violation {
	var out []Violation
	bad := func(f string, a ...any) { out = append(out, Violation{CheckLog, fmt.Sprintf(f, a...)}) }
	if len(evs) == 0 {
		bad("the export is empty")
	}
	for i, e := range evs {
		if want := uint64(i + 1); e.Seq != want {
			bad("line %d holds seq %d, want %d", i+1, e.Seq, want)
			break
		}
	}
	for _, e := range evs {
		if e.Raw != "" || e.Error != "" {
			bad("seq %d is undecodable: %s", e.Seq, e.Error)
		}
	}
	if replayCode != 0 {
		bad("replay --check exited %d: %s", replayCode, lastLines(replayOut, 5))
	}
	return out
}

// OneWriterPerTerm checks the terms of the log: every term is started by
// a term.started of that term whose leader is its writer and whose lease
// revision is newer than the term before's, terms only grow along the log
// (an event of a lower term than the current one is a write that got past
// the CAS fence), and each term has one writer.
func OneWriterPerTerm(evs []Event) []Violation {
	var out []Violation
	bad := func(f string, a ...any) { out = append(out, Violation{CheckTerms, fmt.Sprintf(f, a...)}) }
	writer := map[uint64]string{}
	var cur, lease uint64
	for _, e := range evs {
		if e.Raw != "" {
			continue
		}
		if w, ok := writer[e.Term]; ok && w != e.Writer {
			bad("term %d has two writers: %s and %s (seq %d)", e.Term, w, e.Writer, e.Seq)
		} else if !ok {
			writer[e.Term] = e.Writer
		}
		if e.Type == "term.started" {
			var d struct {
				Term   uint64 `json:"term"`
				Leader string `json:"leader"`
				Lease  uint64 `json:"lease"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				bad("seq %d: term.started data: %v", e.Seq, err)
				continue
			}
			if d.Term != e.Term || d.Leader != e.Writer {
				bad("seq %d: term.started of term %d by %s is stamped term %d by %s", e.Seq, d.Term, d.Leader, e.Term, e.Writer)
			}
			if e.Term <= cur {
				bad("seq %d: term %d started after term %d", e.Seq, e.Term, cur)
				continue
			}
			// The lease revision is the fencing token: a term started under
			// a lease no newer than the current term's is a lapsed holder's,
			// which the projection rejects (it starts nothing).
			if lease != 0 && d.Lease <= lease {
				bad("seq %d: term.started of term %d by %s under lease %d, not newer than term %d's lease %d", e.Seq, e.Term, e.Writer, d.Lease, cur, lease)
				continue
			}
			cur, lease = e.Term, d.Lease
			continue
		}
		switch {
		case e.Term < cur:
			bad("seq %d: %s of term %d by %s landed in term %d", e.Seq, e.Type, e.Term, e.Writer, cur)
		case e.Term > cur:
			bad("seq %d: %s of term %d by %s before term %d started", e.Seq, e.Type, e.Term, e.Writer, e.Term)
		}
	}
	return out
}

// Workers checks the projected workers against the worker processes:
// at most one active worker per endpoint, ids unique, and the id each
// running worker process holds (running: endpoint -> the id its log says
// it registered last since it started; 0: none yet) is the one active at
// its endpoint, running; no worker is active at an endpoint nobody runs
// (probes, the runner's own clients, may or may not hold a registration).
func Workers(ws []StatusWorker, running map[string]uint64, probes []string) []Violation {
	var out []Violation
	bad := func(f string, a ...any) { out = append(out, Violation{CheckWorkers, fmt.Sprintf(f, a...)}) }
	byEP := map[string][]StatusWorker{}
	ids := map[uint64]bool{}
	for _, w := range ws {
		byEP[w.Endpoint] = append(byEP[w.Endpoint], w)
		if ids[w.ID] {
			bad("worker id %d listed twice", w.ID)
		}
		ids[w.ID] = true
	}
	for _, ep := range sortedKeys(byEP) {
		if l := byEP[ep]; len(l) > 1 {
			var s []string
			for _, w := range l {
				s = append(s, fmt.Sprintf("%d (%s)", w.ID, w.State))
			}
			bad("endpoint %s has %d active workers: %s", ep, len(l), strings.Join(s, ", "))
		}
	}
	for _, ep := range sortedKeys(running) {
		id := running[ep]
		l := byEP[ep]
		switch {
		case id == 0:
			bad("the worker process at %s holds no registration", ep)
		case len(l) == 0:
			bad("the worker process at %s holds id %d, which is not active", ep, id)
		}
		for _, w := range l {
			if id != 0 && w.ID != id {
				bad("endpoint %s: id %d is active but its process holds id %d", ep, w.ID, id)
			}
			if w.State != "running" {
				bad("the worker at %s is %s (id %d), not running", ep, w.State, w.ID)
			}
		}
	}
	for _, ep := range sortedKeys(byEP) {
		if _, ok := running[ep]; !ok && !slices.Contains(probes, ep) {
			bad("worker %d is active at %s, where no worker runs", byEP[ep][0].ID, ep)
		}
	}
	return out
}

// RegisteredID reads a worker process's log: the worker_id of its last
// "registered" line since the harness last started it (0: none).
func RegisteredID(log string) uint64 {
	if i := strings.LastIndex(log, "=== chaos: start"); i >= 0 {
		log = log[i:]
	}
	var id uint64
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"registered"`) {
			continue
		}
		var l struct {
			Msg string `json:"message"`
			ID  uint64 `json:"worker_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "registered" {
			id = l.ID
		}
	}
	return id
}

// ShardsInput is what Shards reads: the status read, the stores whose
// processes run, and the replicas each store's NodeHost runs (from its
// /metrics).
type ShardsInput struct {
	Status        Status
	Shards        int // the shards the cluster keeps
	Replicas      int // replicas per shard
	LiveStores    []string
	StoreReplicas map[string][]ReplicaKey // store id -> replicas it runs
}

// Shards checks that every shard is R/R on live stores, as the
// projection, the leader's health record and the stores themselves say,
// and that no store runs a replica the projection does not list for it.
func Shards(in ShardsInput) []Violation {
	var out []Violation
	bad := func(f string, a ...any) { out = append(out, Violation{CheckShards, fmt.Sprintf(f, a...)}) }
	st := in.Status
	if len(st.Shards) != in.Shards {
		bad("%d shards projected, want %d", len(st.Shards), in.Shards)
	}
	// member: store -> set of (shard, replica) the projection lists.
	member := map[string]map[ReplicaKey]bool{}
	for _, sh := range st.Shards {
		stores := map[string]bool{}
		for r, s := range sh.Members {
			if member[s] == nil {
				member[s] = map[ReplicaKey]bool{}
			}
			member[s][ReplicaKey{sh.ID, r}] = true
			if stores[s] {
				bad("shard %d has two replicas on %s", sh.ID, s)
			}
			stores[s] = true
			if !slices.Contains(in.LiveStores, s) {
				bad("shard %d replica %d is on %s, which is not running", sh.ID, r, s)
			}
		}
		if len(sh.Members) != in.Replicas {
			bad("shard %d has %d members %v, want %d", sh.ID, len(sh.Members), sh.Members, in.Replicas)
		}
		if len(sh.Pending) > 0 || sh.Operator != "" {
			bad("shard %d still changing: pending %v operator %q", sh.ID, sh.Pending, sh.Operator)
		}
	}
	rec := st.Health.Record
	if rec == nil {
		bad("no health record")
	} else {
		for _, h := range rec.Shards {
			if h.Live != in.Replicas || !h.Healthy {
				bad("health: shard %d runs %d/%d (healthy %v, leader %d@%s)", h.Shard, h.Live, in.Replicas, h.Healthy, h.Leader, h.LeaderStore)
			}
		}
		if len(rec.Shards) != in.Shards {
			bad("health record has %d shards, want %d", len(rec.Shards), in.Shards)
		}
	}
	for _, s := range in.LiveStores {
		runs := map[ReplicaKey]bool{}
		for _, k := range in.StoreReplicas[s] {
			runs[k] = true
			if !member[s][k] {
				bad("%s runs shard %d replica %d, which the projection does not list on it", s, k.Shard, k.Replica)
			}
		}
		for k := range member[s] {
			if !runs[k] {
				bad("%s does not run shard %d replica %d, a projected member", s, k.Shard, k.Replica)
			}
		}
	}
	return out
}

var panicLine = regexp.MustCompile(`(^|[^A-Za-z])(panic: |fatal error: |WARNING: DATA RACE|SIGSEGV)`)

// NoPanics checks every process log (name -> content) for a Go panic, a
// fatal runtime error or a race report.
func NoPanics(logs map[string]string) []Violation {
	var out []Violation
	for _, name := range sortedKeys(logs) {
		for i, line := range strings.Split(logs[name], "\n") {
			if panicLine.MatchString(line) {
				out = append(out, Violation{CheckPanics, fmt.Sprintf("%s line %d: %.300s", name, i+1, line)})
				break
			}
		}
	}
	return out
}

// NoExits checks that no process ended without the harness asking
// (exits: process name -> how each such run ended).
func NoExits(exits map[string][]string) []Violation {
	var out []Violation
	for _, name := range sortedKeys(exits) {
		for _, e := range exits[name] {
			out = append(out, Violation{CheckExits, name + ": " + e})
		}
	}
	return out
}

// Recovered checks that the cluster was healthy within bound of the heal
// (took < 0: it never was).
func Recovered(took, bound time.Duration) []Violation {
	if took < 0 {
		return []Violation{{CheckRecovery, fmt.Sprintf("not healthy within %s of the heal", bound)}}
	}
	if took > bound {
		return []Violation{{CheckRecovery, fmt.Sprintf("healthy %s after the heal, bound %s", took.Round(time.Millisecond), bound)}}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// CheckQuorum names QuorumKept's violations.
const CheckQuorum = "config-change-quorum"

// QuorumKept folds an export (JSONL) and checks the scheduler's quorum rule from
// the outside at every operator start and change intent: the shard's
// membership has a quorum of replicas on stores not marked down, and so
// has the membership after the change (a replica being added does not run
// yet). The scheduler's own notion of running is stricter (a fresh report
// from a live store), so a change it may make always passes here.
func QuorumKept(export io.Reader) ([]Violation, error) {
	r := events.NewJSONLReader(export)
	st := projections.New()
	var out []Violation
	live := func(sh *projections.Shard, ids []uint64) int {
		n := 0
		for _, id := range ids {
			store, ok := sh.Members[id]
			if !ok {
				continue // the replica being added
			}
			if s := st.Stores[store]; s != nil && s.State != events.StoreDown && s.State != events.StoreTombstone {
				n++
			}
		}
		return n
	}
	members := func(sh *projections.Shard) []uint64 {
		var ids []uint64
		for id := range sh.Members {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids
	}
	check := func(ev events.Event, shard, remove uint64, add bool) {
		sh := st.Shards[shard]
		if sh == nil {
			return
		}
		before := members(sh)
		if n, need := live(sh, before), len(before)/2+1; n < need {
			out = append(out, Violation{CheckQuorum, fmt.Sprintf("seq %d %s on shard %d: %d of %d members on live stores, a change needs %d (members %v, stores %v)",
				ev.Seq, ev.Type(), shard, n, len(before), need, sh.Members, storeStates(st))})
			return
		}
		after := slices.DeleteFunc(slices.Clone(before), func(id uint64) bool { return id == remove })
		if add {
			after = append(after, 0) // the new replica: not running yet
		}
		if n, need := live(sh, after), len(after)/2+1; n < need {
			out = append(out, Violation{CheckQuorum, fmt.Sprintf("seq %d %s on shard %d: after it %d of %d members would run on live stores, quorum is %d (members %v, stores %v)",
				ev.Seq, ev.Type(), shard, n, len(after), need, sh.Members, storeStates(st))})
		}
	}
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		// Only events of the current term are applied (a stale one is
		// rejected, and OneWriterPerTerm reports it).
		if ev.Term == st.Term {
			switch d := ev.Data.(type) {
			case events.OperatorStarted:
				check(ev, d.Shard, d.Remove, d.Add != "")
			case events.ShardReplicaRemoving:
				check(ev, d.Shard, d.Replica, false)
			case events.ShardReplicaAdding:
				check(ev, d.Shard, 0, true)
			}
		}
		st.Apply(ev)
	}
}

func storeStates(st *projections.State) string {
	var s []string
	for _, id := range sortedKeys(st.Stores) {
		s = append(s, id+"="+st.Stores[id].State)
	}
	return strings.Join(s, " ")
}

// LeaderStopped checks that a meta leader cut from NATS stopped leading
// within its lease (plus slack for the scrape's polling): stopped is how
// long after the cut its /metrics first said it no longer leads, -1 if it
// still led when the cut was healed (held for held).
func LeaderStopped(name string, stopped, held, lease, slack time.Duration) []Violation {
	switch {
	case stopped < 0:
		return []Violation{{CheckStepDown, fmt.Sprintf("%s still led %s after it was cut from NATS (lease %s)", name, held.Round(time.Millisecond), lease)}}
	case stopped > lease+slack:
		return []Violation{{CheckStepDown, fmt.Sprintf("%s stopped leading %s after it was cut from NATS, past its lease %s (+%s slack)", name, stopped.Round(time.Millisecond), lease, slack)}}
	}
	return nil
}
