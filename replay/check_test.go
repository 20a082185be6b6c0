package replay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/termlog/termlog/projections"
)

// The projection keeps its invariants on every input, so a violation can
// only be shown with a state broken by hand: the check must name the first
// event after which it holds no longer.
func TestCheckNamesFirstViolation(t *testing.T) {
	const log = `{"seq":1,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:01Z","type":"term.started","data":{"term":1,"leader":"meta-1"}}
{"seq":2,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:02Z","type":"worker.registered","data":{"id":1,"endpoint":"a:1"}}
{"seq":3,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:03Z","type":"worker.activated","data":{"id":1,"epoch":2}}
`
	var out bytes.Buffer
	r := &runner{o: Options{Mode: ModeCheck, JSON: true, Diag: &bytes.Buffer{}}, f: NewFolder()}
	r.out = bufio.NewWriter(&out)
	err := JSONL(strings.NewReader(log)).Read(context.Background(), func(it Item) error {
		if it.Seq == 3 {
			// Break the state as a bug in the fold would: an endpoint
			// pointing at no worker.
			r.f.State().Endpoints["b:2"] = 9
		}
		return r.item(it)
	})
	var ce *CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("want a *CheckError, got %v", err)
	}
	if ce.Seq != 3 || ce.Line != 3 || ce.Events != 3 {
		t.Errorf("got seq %d line %d events %d, want 3 3 3", ce.Seq, ce.Line, ce.Events)
	}
	var v projections.Violation
	if !errors.As(err, &v) || v.Rule != projections.RuleOneWorkerPerEndpoint {
		t.Errorf("want a one-worker-per-endpoint violation, got %v", err)
	}
	want := "check failed after seq 3 (line 3), event 3: seq 3: invariant one-worker-per-endpoint violated: endpoint b:2 maps to worker 9 which is not active there"
	if err.Error() != want {
		t.Errorf("error:\n got %s\nwant %s", err, want)
	}
	_ = r.out.Flush()
	if !strings.Contains(out.String(), `"ok":false`) || !strings.Contains(out.String(), `"seq":3`) {
		t.Errorf("json output: %s", out.String())
	}
}
