package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/termlog/termlog/chaos/history"
	"github.com/termlog/termlog/meta/client"
)

// refused are the outcomes of a request that certainly changed nothing:
// nobody served the subject, or the request was malformed. (not_leader is
// not one: a leader deposed during the append answers it too, and its
// append may have landed.) They are left out of the history (an operation
// without effect constrains nothing, and each unknown one multiplies the
// checker's search).
var refused = map[string]bool{"no_responders": true, client.CodeBadRequest: true}

// ToHistory turns the runner's recorded operations into chaos/history's:
// times become offsets from the first invocation; refusals are left out;
// a reply's error code is definite for reregister and forbidden, and
// anything else (unavailable, no reply) is an unknown outcome, which the
// model lets take effect at any point after the invocation.
func ToHistory(ops []Op) []history.Op {
	if len(ops) == 0 {
		return nil
	}
	base := ops[0].Invoke
	for _, op := range ops {
		if op.Invoke.Before(base) {
			base = op.Invoke
		}
	}
	out := make([]history.Op, 0, len(ops))
	for _, op := range ops {
		done := op.Done || !op.Return.IsZero() // an operation with a return time has returned
		if done && refused[op.Outcome] {
			continue
		}
		h := history.Op{Client: op.Client, Call: op.Invoke.Sub(base), Done: done}
		if done {
			h.Return = op.Return.Sub(base)
		} else {
			op.Outcome = OutcomeUnknown
		}
		switch op.Outcome {
		case OutcomeOK:
			h.Output.Outcome = history.OK
		case client.CodeReregister:
			h.Output.Outcome = history.Reregister
		case client.CodeForbidden:
			h.Output.Outcome = history.Forbidden
		default:
			h.Output.Outcome = history.Unknown
			h.Output.Err = op.Outcome
		}
		switch op.Kind {
		case OpStatus:
			h.Input = history.Input{Kind: history.Read}
			if h.Output.Outcome == history.OK {
				h.Output.Seq = op.Seq
				for _, w := range op.Workers {
					h.Output.Workers = append(h.Output.Workers, history.Worker{ID: w.ID, Epoch: w.Epoch, Incarnation: w.Incarnation, Endpoint: w.Endpoint, State: w.State})
				}
			}
		case OpRegister:
			h.Input = history.Input{Kind: history.Register, Incarnation: op.Incarnation, Endpoint: op.Endpoint}
			if h.Output.Outcome == history.OK {
				h.Output.ID, h.Output.Epoch = op.ReplyID, op.ReplyEpoch
			}
		default:
			kind := map[OpKind]history.Kind{OpActivate: history.Activate, OpHeartbeat: history.Heartbeat, OpDeregister: history.Deregister}[op.Kind]
			h.Input = history.Input{Kind: kind, ID: op.ID, Epoch: op.Epoch}
		}
		out = append(out, h)
	}
	return out
}

// HistoryChecker checks a schedule's history with chaos/history against
// the worker registry's model (worker timeout: the cluster's). A history
// that is not linearizable (or whose check is undecided within a minute)
// is a violation; its porcupine visualisation is then saved in dir.
func HistoryChecker(workerTimeout time.Duration) func(ops []Op, dir string) []Violation {
	return func(ops []Op, dir string) []Violation {
		vis := filepath.Join(dir, "history")
		res, err := history.Check(ToHistory(ops), history.Options{WorkerTimeout: workerTimeout, Timeout: time.Minute, Dir: vis})
		if err == nil {
			_ = os.RemoveAll(vis) // the visualisation is kept for a failed check only
			return nil
		}
		return []Violation{{CheckHistory, fmt.Sprintf("%d operations: %v", res.Ops, err)}}
	}
}
