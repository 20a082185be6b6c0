package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Options configure Check.
type Options struct {
	// WorkerTimeout is the meta leader's worker timeout: no registration
	// expires sooner than this after an acknowledged heartbeat's
	// invocation. Required.
	WorkerTimeout time.Duration
	// Dir, when set, receives porcupine's visualisation (history.html)
	// and the history itself (history.jsonl).
	Dir string
	// Timeout bounds the search (default 1 minute).
	Timeout time.Duration
}

// ErrNotLinearizable is matched by Check's error for a history that the
// model cannot explain.
var ErrNotLinearizable = errors.New("history is not linearizable")

// ErrUndecided is matched by Check's error when the search ran out of time.
var ErrUndecided = errors.New("linearizability undecided within the timeout")

// Result is what Check found.
type Result struct {
	Ops     int    // operations checked
	Skipped int    // reads that failed (no output, no effect)
	Visual  string // path of the visualisation, when Options.Dir was set
}

// Check checks a history against the worker registry's model. It returns
// nil when the history is linearizable; otherwise an error matching
// ErrNotLinearizable (naming the operations that cannot be placed and
// why) or ErrUndecided.
func Check(ops []Op, o Options) (Result, error) {
	if o.WorkerTimeout <= 0 {
		return Result{}, errors.New("history: Options.WorkerTimeout is required")
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	m := model{timeout: o.WorkerTimeout}
	pm := m.porcupine()
	var res Result
	hist := make([]porcupine.Operation, 0, len(ops))
	clients := map[string]int{}
	for _, op := range ops {
		if !op.Done {
			op.Output = Output{Outcome: Unknown, Err: "pending when the history was taken"}
		}
		if op.Input.Kind == Read && op.Output.Outcome != OK {
			res.Skipped++
			continue
		}
		if op.Done && op.Return < op.Call {
			return res, fmt.Errorf("history: %s returned before its call (%v < %v)", describe(op), op.Return, op.Call)
		}
		c := call{Op: op, ret: op.Return, idx: len(hist)}
		if op.Output.Outcome == Unknown {
			c.ret = forever // it may take effect at any point after its call
		}
		id, ok := clients[op.Client]
		if !ok {
			id = len(clients)
			clients[op.Client] = id
		}
		hist = append(hist, porcupine.Operation{ClientId: id, Input: c, Call: int64(op.Call), Output: op.Output, Return: int64(c.ret)})
	}
	res.Ops = len(hist)
	verdict, info := porcupine.CheckOperationsVerbose(pm, hist, o.Timeout)
	var saveErr error
	if o.Dir != "" {
		saveErr = errors.Join(os.MkdirAll(o.Dir, 0o755))
		if saveErr == nil {
			res.Visual = filepath.Join(o.Dir, "history.html")
			saveErr = errors.Join(porcupine.VisualizePath(pm, info, res.Visual), SaveJSONL(filepath.Join(o.Dir, "history.jsonl"), ops))
		}
	}
	var err error
	switch verdict {
	case porcupine.Ok:
	case porcupine.Unknown:
		err = fmt.Errorf("%w: %d operations, search stopped after %v", ErrUndecided, len(hist), o.Timeout)
	default:
		err = fmt.Errorf("%w: %s", ErrNotLinearizable, explain(m, hist, info))
	}
	if err != nil && res.Visual != "" {
		err = fmt.Errorf("%w (visualisation: %s)", err, res.Visual)
	}
	if saveErr != nil {
		err = errors.Join(err, fmt.Errorf("saving the visualisation: %w", saveErr))
	}
	return res, err
}

// explain replays the longest partial linearization porcupine found and
// says why none of the operations that could come next fits.
func explain(m model, hist []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	s := state{regs: map[uint64]reg{}}
	done := map[int]bool{}
	for _, op := range longest {
		n, err := m.step(s, op.Input.(call))
		if err != nil {
			return fmt.Sprintf("replaying the longest partial linearization failed at %s: %v", describe(op.Input.(call).Op), err)
		}
		s = n
		done[op.Input.(call).idx] = true
	}
	var rest []porcupine.Operation
	minRet := int64(forever)
	for _, op := range hist {
		if done[op.Input.(call).idx] {
			continue
		}
		rest = append(rest, op)
		minRet = min(minRet, op.Return)
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	var why []string
	for _, op := range rest {
		if op.Call > minRet {
			break // it cannot come before the operation that returned first
		}
		c := op.Input.(call)
		if _, err := m.step(s, c); err != nil {
			why = append(why, fmt.Sprintf("%s [%s, %v..%v]: %v", describe(c.Op), c.Client, c.Call.Round(time.Millisecond), c.Return.Round(time.Millisecond), err))
		}
		if len(why) == 5 {
			break
		}
	}
	last := "none"
	if len(longest) > 0 {
		last = describe(longest[len(longest)-1].Input.(call).Op)
	}
	return fmt.Sprintf("after %d of %d operations (the last placed: %s; state %s) no next operation fits:\n  %s",
		len(longest), len(hist), last, s, strings.Join(why, "\n  "))
}
