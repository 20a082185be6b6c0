package projections_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/termlog/termlog/projections"
)

// base is the time of seq 0 in scripts; event seq n happens at base+n seconds.
var base = time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)

// TestData runs the scripts in testdata/. Commands:
//
//	apply            one event per line: "<term> <writer> <type> <json data>",
//	                 or "raw <body>" for a body stored as is (corrupt, forged);
//	                 prints each event's seq and outcome
//	state            renders the whole state
//	workers          lists active workers (the list_workers view)
//	check            runs the invariants ("ok" or the violations)
//	anomalies        lists rejected and corrupt events
//	snapshot         encodes, decodes and re-renders ("same" when identical)
func TestData(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		s := projections.New()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "apply":
				var out strings.Builder
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					line = strings.TrimSpace(line)
					if line == "" || strings.HasPrefix(line, "#") {
						continue
					}
					seq := s.Seq + 1
					var r projections.Result
					if body, ok := strings.CutPrefix(line, "raw "); ok {
						r = s.DecodeApply(seq, []byte(body))
					} else {
						body, err := scriptEvent(line, seq)
						if err != nil {
							d.Fatalf(t, "%v", err)
						}
						r = s.DecodeApply(seq, body)
					}
					fmt.Fprintf(&out, "%d %s\n", seq, r)
				}
				return out.String()
			case "state":
				return s.Render()
			case "workers":
				var out strings.Builder
				for _, w := range s.ListWorkers() {
					fmt.Fprintf(&out, "%d epoch=%d %s %s\n", w.ID, w.Epoch, w.Endpoint, w.State)
				}
				if out.Len() == 0 {
					return "none\n"
				}
				return out.String()
			case "check":
				if err := s.CheckInvariants(); err != nil {
					return err.Error() + "\n"
				}
				return "ok\n"
			case "anomalies":
				var out strings.Builder
				for _, a := range s.Anomalies {
					fmt.Fprintf(&out, "seq=%d term=%d writer=%s type=%s %s: %s\n", a.Seq, a.Term, a.Writer, a.Type, a.Kind, a.Reason)
				}
				if out.Len() == 0 {
					return "none\n"
				}
				return out.String()
			case "snapshot":
				got, err := projections.DecodeSnapshot(s.EncodeSnapshot())
				if err != nil {
					return err.Error() + "\n"
				}
				if got.Render() == s.Render() && got.Hash() == s.Hash() {
					return "same\n"
				}
				return "differs:\n" + got.Render()
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
				return ""
			}
		})
	})
}

// scriptEvent turns "<term> <writer> <type> <json>" into an encoded body.
func scriptEvent(line string, seq uint64) ([]byte, error) {
	f := strings.SplitN(line, " ", 4)
	if len(f) < 4 {
		return nil, fmt.Errorf("want <term> <writer> <type> <json>, got %q", line)
	}
	term, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("term %q: %v", f[0], err)
	}
	at := base.Add(time.Duration(seq) * time.Second).Format(time.RFC3339Nano)
	return fmt.Appendf(nil, `{"v":1,"term":%d,"writer":%q,"at":%q,"type":%q,"data":%s}`, term, f[1], at, f[2], f[3]), nil
}
