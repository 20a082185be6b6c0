package replay

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// timeFormat is fixed width, so timeline columns line up.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

const lineFormat = "%-6v %-25s %-5v %-9s %-23s %-21s %s"

var timelineHeader = fmt.Sprintf(lineFormat, "seq", "at", "term", "writer", "type", "outcome", "data  # what the fold did")

// formatStep is one timeline line: seq, time, term, writer, type, outcome,
// data summary and the fold's reason.
func formatStep(st Step) string {
	at := "-"
	if !st.Event.At.IsZero() {
		at = st.Event.At.UTC().Format(timeFormat)
	}
	seq := any(st.Seq)
	if st.Seq == 0 {
		seq = "?" // a damaged line that does not say
	}
	line := fmt.Sprintf(lineFormat,
		seq, at, st.Event.Term, orDash(st.Event.Writer), orDash(st.Type()), outcome(st.Result), summary(st.Item))
	if why := st.Result.Reason; why != "" || st.Result.Warning != "" {
		if st.Result.Warning != "" {
			why = strings.TrimPrefix(why+"; warning "+st.Result.Warning, "; ")
		}
		line += "  # " + why
	}
	return strings.TrimRight(line, " ")
}

// outcome is the outcome with its anomaly kind: "applied", "noop",
// "rejected stale-term", "corrupt", ...
func outcome(r projections.Result) string {
	if r.Outcome == projections.Rejected && r.Kind != "" {
		return r.Outcome.String() + " " + r.Kind
	}
	return r.Outcome.String()
}

// summary is a compact, one-line rendering of an entry's data.
func summary(it Item) string {
	if it.Err != nil {
		switch {
		case it.Body != nil:
			return "raw=" + quoteTrunc(it.Body, 60)
		case it.Line > 0:
			return fmt.Sprintf("line=%d", it.Line)
		}
		return "-"
	}
	switch d := it.Event.Data.(type) {
	case events.TermStarted:
		if d.Lease != 0 {
			return fmt.Sprintf("term=%d leader=%s lease=%d", d.Term, orDash(d.Leader), d.Lease)
		}
		return fmt.Sprintf("term=%d leader=%s", d.Term, orDash(d.Leader))
	case events.WorkerRegistered:
		s := fmt.Sprintf("id=%d endpoint=%s inc=%s kind=%s par=%d", d.ID, orDash(d.Endpoint), orDash(d.Incarnation), orDash(d.Kind), d.Parallelism)
		if d.Epoch != 0 {
			s += fmt.Sprintf(" epoch=%d", d.Epoch)
		}
		return s
	case events.WorkerActivated:
		return fmt.Sprintf("id=%d epoch=%d", d.ID, d.Epoch)
	case events.WorkerExpired:
		return fmt.Sprintf("id=%d epoch=%d", d.ID, d.Epoch)
	case events.WorkerDeregistered:
		return fmt.Sprintf("id=%d epoch=%d", d.ID, d.Epoch)
	case events.StoreRegistered:
		return fmt.Sprintf("store=%s raft=%s inc=%s", orDash(d.Store), orDash(d.RaftAddr), orDash(d.Incarnation))
	case events.StoreState:
		s := fmt.Sprintf("store=%s state=%s", orDash(d.Store), orDash(d.State))
		if !d.Until.IsZero() {
			s += " until=" + d.Until.UTC().Format(time.RFC3339)
		}
		return s
	case events.ShardCreated:
		return fmt.Sprintf("shard=%d replicas=%s", d.Shard, replicaSet(d.Replicas))
	case events.ShardReplicaAdding:
		return replicaChange(events.ReplicaChange(d))
	case events.ShardReplicaAdded:
		return replicaChange(events.ReplicaChange(d))
	case events.ShardReplicaRemoving:
		return replicaChange(events.ReplicaChange(d))
	case events.ShardReplicaRemoved:
		return replicaChange(events.ReplicaChange(d))
	case events.ShardObserved:
		return fmt.Sprintf("shard=%d ccid=%d replicas=%s leader=%d", d.Shard, d.CCID, replicaSet(d.Replicas), d.Leader)
	case events.OperatorStarted:
		return operator(events.Operator(d))
	case events.OperatorFinished:
		return operator(events.Operator(d))
	case events.OperatorFailed:
		return operator(events.Operator(d))
	case events.ShardRecovered:
		s := fmt.Sprintf("shard=%d from=%d@%s applied=%d gone=%s by=%s", d.Shard, d.Replica, orDash(d.Store), d.Applied, replicaSet(d.Gone), orDash(d.Operator))
		if d.Reason != "" {
			s += " reason=" + quoteTrunc([]byte(d.Reason), 80)
		}
		return s
	case nil:
		return "-"
	}
	b, err := json.Marshal(it.Event.Data)
	if err != nil {
		return fmt.Sprintf("%T", it.Event.Data)
	}
	return string(b)
}

func replicaChange(d events.ReplicaChange) string {
	s := fmt.Sprintf("shard=%d replica=%d store=%s ccid=%d", d.Shard, d.Replica, orDash(d.Store), d.CCID)
	if d.Op != "" {
		s += " op=" + d.Op
	}
	if d.Note != "" {
		s += " note=" + strconv.Quote(d.Note)
	}
	return s
}

func operator(d events.Operator) string {
	s := fmt.Sprintf("op=%s shard=%d", orDash(d.Op), d.Shard)
	if len(d.Steps) > 0 {
		s += " steps=" + strings.Join(d.Steps, ",")
	}
	if d.Reason != "" {
		s += " reason=" + strconv.Quote(d.Reason)
	}
	return s
}

func replicaSet(m map[uint64]string) string {
	parts := make([]string, 0, len(m))
	for _, r := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d:%s", r, m[r]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// quoteTrunc quotes b, cut to about n bytes.
func quoteTrunc(b []byte, n int) string {
	if len(b) <= n {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:n])) + "..."
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stepJSON is one timeline entry in --json output.
type stepJSON struct {
	Seq       uint64         `json:"seq"`
	Line      int            `json:"line,omitempty"`
	At        time.Time      `json:"at,omitzero"`
	Term      uint64         `json:"term"`
	Writer    string         `json:"writer"`
	Type      string         `json:"type"`
	Outcome   string         `json:"outcome"`
	Kind      string         `json:"kind,omitempty"`
	Reason    string         `json:"reason,omitempty"`
	Warning   string         `json:"warning,omitempty"`
	Data      events.Payload `json:"data,omitempty"`
	Raw       *string        `json:"raw,omitempty"`
	RawBase64 string         `json:"raw_base64,omitempty"`
	Touch     *touchJSON     `json:"touch,omitempty"`
}

type touchJSON struct {
	Workers   []uint64 `json:"workers,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"`
	Stores    []string `json:"stores,omitempty"`
	Shards    []uint64 `json:"shards,omitempty"`
}

func toJSON(st Step) stepJSON {
	j := stepJSON{
		Seq: st.Seq, Line: st.Line, At: st.Event.At, Term: st.Event.Term, Writer: st.Event.Writer, Type: st.Type(),
		Outcome: st.Result.Outcome.String(), Kind: st.Result.Kind, Reason: st.Result.Reason,
		Warning: st.Result.Warning,
	}
	if st.Err == nil {
		j.Data = st.Event.Data
	} else if st.Body != nil {
		if utf8.Valid(st.Body) {
			s := string(st.Body)
			j.Raw = &s
		} else {
			j.RawBase64 = base64.StdEncoding.EncodeToString(st.Body)
		}
	}
	t := st.Touch
	if len(t.Workers)+len(t.Endpoints)+len(t.Stores)+len(t.Shards) > 0 {
		j.Touch = &touchJSON{t.Workers, t.Endpoints, t.Stores, t.Shards}
	}
	return j
}

// Entity lines, in the same form as projections.State.Render.

func workerLine(w projections.Worker) string {
	return fmt.Sprintf("worker %d epoch=%d %s endpoint=%s inc=%s kind=%s par=%d term=%d",
		w.ID, w.Epoch, w.State, w.Endpoint, orDash(w.Incarnation), orDash(w.Kind), w.Parallelism, w.Term)
}

func storeLine(st projections.Store) string {
	s := fmt.Sprintf("store %s %s raft=%s inc=%s since=%d", st.ID, st.State, st.RaftAddr, orDash(st.Incarnation), st.Since)
	if !st.Until.IsZero() {
		s += " until=" + st.Until.UTC().Format(time.RFC3339)
	}
	return s
}

func shardLine(sh projections.Shard) string {
	s := fmt.Sprintf("shard %d ccid=%d leader=%d members=%s", sh.ID, sh.CCID, sh.Leader, replicaSet(sh.Members))
	if len(sh.Removed) > 0 {
		s += " removed=" + replicaSet(sh.Removed)
	}
	if len(sh.Pending) > 0 {
		parts := []string{}
		for _, r := range sortedKeys(sh.Pending) {
			p := sh.Pending[r]
			parts = append(parts, fmt.Sprintf("%s:%d@%s", p.Kind, r, p.Store))
		}
		s += " pending={" + strings.Join(parts, " ") + "}"
	}
	if sh.Operator != "" {
		s += " operator=" + sh.Operator
	}
	return s
}

func operatorLine(op projections.Operator) string {
	s := fmt.Sprintf("operator %s shard=%d %s started=%d", op.ID, op.Shard, op.State, op.Started)
	if op.Finished != 0 {
		s += fmt.Sprintf(" finished=%d", op.Finished)
	} else if len(op.Steps) > 0 {
		s += " steps=" + strings.Join(op.Steps, ",")
	}
	if op.Reason != "" {
		s += " reason=" + strconv.Quote(op.Reason)
	}
	return s
}

func anomalyLine(a projections.Anomaly) string {
	return fmt.Sprintf("anomaly seq=%d term=%d writer=%s type=%s %s: %s", a.Seq, a.Term, orDash(a.Writer), orDash(a.Type), a.Kind, a.Reason)
}
