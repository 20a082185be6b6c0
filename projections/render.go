package projections

import (
	"fmt"
	"strings"
	"time"
)

// Render writes the state as stable, human-readable text: one line per
// entity, ordered by id. Tests compare it; `replay` prints it.
func (s *State) Render() string {
	s.init()
	var b strings.Builder
	fmt.Fprintf(&b, "seq=%d term=%d leader=%s", s.Seq, s.Term, orDash(s.Leader))
	if s.Lease != 0 {
		fmt.Fprintf(&b, " lease=%d", s.Lease)
	}
	fmt.Fprintf(&b, " next_worker_id=%d", s.NextWorkerID)
	if !s.At.IsZero() {
		fmt.Fprintf(&b, " at=%s", s.At.UTC().Format(time.RFC3339Nano))
	}
	b.WriteByte('\n')
	for _, w := range s.ListWorkers() {
		fmt.Fprintf(&b, "worker %d epoch=%d %s endpoint=%s inc=%s kind=%s par=%d term=%d\n",
			w.ID, w.Epoch, w.State, w.Endpoint, orDash(w.Incarnation), orDash(w.Kind), w.Parallelism, w.Term)
	}
	for _, st := range s.ListStores() {
		fmt.Fprintf(&b, "store %s %s raft=%s inc=%s since=%d", st.ID, st.State, st.RaftAddr, orDash(st.Incarnation), st.Since)
		if !st.Until.IsZero() {
			fmt.Fprintf(&b, " until=%s", st.Until.UTC().Format(time.RFC3339))
		}
		if st.DrainedBy != "" {
			fmt.Fprintf(&b, " drained_by=%s", st.DrainedBy)
		}
		if st.Stopped != "" {
			fmt.Fprintf(&b, " stopped=%s", st.Stopped)
		}
		b.WriteByte('\n')
	}
	for _, sh := range s.ListShards() {
		fmt.Fprintf(&b, "shard %d ccid=%d leader=%d members=%s", sh.ID, sh.CCID, sh.Leader, renderReplicas(sh.Members))
		if len(sh.Removed) > 0 {
			fmt.Fprintf(&b, " removed=%s", renderReplicas(sh.Removed))
		}
		if len(sh.Retired) > 0 {
			fmt.Fprintf(&b, " retired=%s", renderReplicas(sh.Retired))
		}
		if r := sh.Recovered; r != nil {
			fmt.Fprintf(&b, " recovered=%d@%s(seq=%d,applied=%d)", r.Replica, r.Store, r.Seq, r.Applied)
		}
		if len(sh.Pending) > 0 {
			parts := []string{}
			for _, r := range sortedKeys(sh.Pending) {
				p := sh.Pending[r]
				parts = append(parts, fmt.Sprintf("%s:%d@%s", p.Kind, r, p.Store))
			}
			fmt.Fprintf(&b, " pending={%s}", strings.Join(parts, " "))
		}
		if sh.Operator != "" {
			fmt.Fprintf(&b, " operator=%s", sh.Operator)
		}
		if sh.Blocked != "" {
			fmt.Fprintf(&b, " blocked=%q", sh.Blocked)
		}
		b.WriteByte('\n')
	}
	for _, id := range sortedKeys(s.Operators) {
		op := s.Operators[id]
		fmt.Fprintf(&b, "operator %s shard=%d %s started=%d steps=%s", op.ID, op.Shard, op.State, op.Started, strings.Join(op.Steps, ","))
		if op.Remove != 0 {
			fmt.Fprintf(&b, " remove=%d", op.Remove)
		}
		if op.Add != "" {
			fmt.Fprintf(&b, " add=%s", op.Add)
		}
		if op.Term != s.Term {
			fmt.Fprintf(&b, " inherited_from_term=%d", op.Term)
		}
		b.WriteByte('\n')
	}
	for _, op := range s.History {
		fmt.Fprintf(&b, "operator %s shard=%d %s started=%d finished=%d", op.ID, op.Shard, op.State, op.Started, op.Finished)
		if op.Reason != "" {
			fmt.Fprintf(&b, " reason=%q", op.Reason)
		}
		b.WriteByte('\n')
	}
	c := s.Counters
	fmt.Fprintf(&b, "counters applied=%d noops=%d rejected=%d stale_term=%d corrupt=%d\n", c.Applied, c.NoOps, c.Rejected, c.StaleTerm, c.Corrupt)
	for _, a := range s.Anomalies {
		fmt.Fprintf(&b, "anomaly seq=%d term=%d writer=%s type=%s %s: %s\n", a.Seq, a.Term, orDash(a.Writer), orDash(a.Type), a.Kind, a.Reason)
	}
	return b.String()
}

func renderReplicas(m map[uint64]string) string {
	parts := make([]string, 0, len(m))
	for _, r := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d:%s", r, m[r]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
