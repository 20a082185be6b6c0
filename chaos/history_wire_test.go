package chaos

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/chaos/history"
	"github.com/termlog/termlog/meta/client"
)

// The chaos runs check their recorded client operations with
// chaos/history (the hook chaos_test.go leaves for it).
func init() { historyChecker = checkOpHistory }

// checkOpHistory checks the runner's operations against the worker
// registry's model; a history not shown linearizable (a violation, or a
// search that ran out of time) is a violation. The visualisation and the
// history go to dir.
func checkOpHistory(ops []Op, dir string) []Violation {
	h := toHistory(ops)
	if len(h) == 0 {
		return nil
	}
	_, err := history.Check(h, history.Options{WorkerTimeout: DefaultConfig("", "", Standalone).WorkerTimeout, Dir: dir, Timeout: 2 * time.Minute})
	if err == nil {
		return nil
	}
	if errors.Is(err, history.ErrUndecided) {
		return []Violation{{CheckHistory, "not shown linearizable: " + err.Error()}}
	}
	return []Violation{{CheckHistory, err.Error()}}
}

// toHistory converts the runner's operations: times become offsets from
// the first invocation; an outcome other than ok, reregister and
// forbidden (no reply, not_leader, unavailable after the retries) may
// have taken effect and is unknown.
func toHistory(ops []Op) []history.Op {
	var start time.Time
	for _, op := range ops {
		if start.IsZero() || op.Invoke.Before(start) {
			start = op.Invoke
		}
	}
	out := make([]history.Op, 0, len(ops))
	for _, op := range ops {
		h := history.Op{Client: op.Client, Call: op.Invoke.Sub(start), Return: op.Return.Sub(start), Done: true}
		switch op.Kind {
		case OpRegister:
			h.Input = history.Input{Kind: history.Register, Endpoint: op.Endpoint, Incarnation: op.Incarnation}
		case OpActivate:
			h.Input = history.Input{Kind: history.Activate, ID: op.ID, Epoch: op.Epoch}
		case OpHeartbeat:
			h.Input = history.Input{Kind: history.Heartbeat, ID: op.ID, Epoch: op.Epoch}
		case OpDeregister:
			h.Input = history.Input{Kind: history.Deregister, ID: op.ID, Epoch: op.Epoch}
		case OpStatus:
			h.Input = history.Input{Kind: history.Read}
		default:
			continue
		}
		switch op.Outcome {
		case OutcomeOK:
			h.Output = history.Output{Outcome: history.OK, ID: op.ReplyID, Epoch: op.ReplyEpoch}
		case client.CodeReregister:
			h.Output = history.Output{Outcome: history.Reregister}
		case client.CodeForbidden:
			h.Output = history.Output{Outcome: history.Forbidden}
		default:
			h.Output = history.Output{Outcome: history.Unknown, Err: op.Outcome}
		}
		if op.Kind == OpStatus && h.Output.Outcome == history.OK {
			h.Output.Seq = op.Seq
			for _, w := range op.Workers {
				h.Output.Workers = append(h.Output.Workers, history.Worker{ID: w.ID, Epoch: w.Epoch, Incarnation: w.Incarnation, Endpoint: w.Endpoint, State: w.State})
			}
		}
		out = append(out, h)
	}
	return out
}

func TestHistoryWiring(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	good := []Op{
		{Client: "probe-1", Kind: OpRegister, Endpoint: "127.0.0.1:1", Incarnation: "i1", Invoke: ms(0), Return: ms(10), Outcome: OutcomeOK, ReplyID: 1, ReplyEpoch: 3},
		{Client: "probe-1", Kind: OpHeartbeat, ID: 1, Epoch: 3, Invoke: ms(20), Return: ms(30), Outcome: OutcomeOK},
		{Client: "status", Kind: OpStatus, Invoke: ms(40), Return: ms(50), Outcome: OutcomeOK, Seq: 4,
			Workers: []StatusWorker{{ID: 1, Epoch: 3, Incarnation: "i1", Endpoint: "127.0.0.1:1", State: "running"}}},
		{Client: "probe-1", Kind: OpDeregister, ID: 1, Epoch: 3, Invoke: ms(60), Return: ms(70), Outcome: client.CodeUnavailable},
		{Client: "status", Kind: OpStatus, Invoke: ms(80), Return: ms(90), Outcome: OutcomeOK, Seq: 5},
	}
	if v := checkOpHistory(good, t.TempDir()); len(v) != 0 {
		t.Fatalf("want no violation, got %v", v)
	}
	// The same with the deregistration refused (forbidden: it changed
	// nothing): the registration may not vanish 80 ms after a heartbeat.
	bad := append([]Op(nil), good...)
	bad[3].Outcome = client.CodeForbidden
	v := checkOpHistory(bad, t.TempDir())
	if len(v) != 1 || v[0].Check != CheckHistory || !strings.Contains(v[0].Detail, "missing") {
		t.Fatalf("want a history violation naming the missing registration, got %v", v)
	}
}
