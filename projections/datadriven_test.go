package projections_test

import (
	"fmt"
	"os"
	"path/filepath"
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
//	state [brief]    renders the whole state; brief leaves out the anomalies
//	workers          lists active workers (the list_workers view)
//	check            runs the invariants ("ok" or the violations)
//	anomalies [tail=n]
//	                 lists rejected and corrupt events; with tail, how many
//	                 are kept, the oldest kept seq and only the newest n
//	history [tail=n] lists ended operators (all, or how many are kept, the
//	                 oldest kept and the newest n)
//	counters         prints the counters and the sizes of the bounded lists
//	snapshot         encodes, decodes and re-renders ("same" when identical)
//	stale-flood n=<n> [term=<t>] [writer=<w>]
//	                 applies n worker.expired events at term t (default: the
//	                 current term - 1); prints the seq range and the outcomes
//	corrupt-flood n=<n>
//	                 applies n bodies that are not JSON; prints as stale-flood
//	op-flood n=<n> shard=<id>
//	                 starts and finishes n operators op-flood-<i> on a shard
//	                 in the current term; prints as stale-flood
func TestData(t *testing.T) {
	// Only the scripts at the top of testdata/: its sub-directories hold the
	// fuzz corpus (testdata/fuzz) and rapid's fail files (testdata/rapid).
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) { runScript(t, filepath.Join("testdata", e.Name())) })
	}
}

func runScript(t *testing.T, path string) {
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
			if !d.HasArg("brief") {
				return s.Render()
			}
			var out strings.Builder
			for _, line := range strings.SplitAfter(s.Render(), "\n") {
				if !strings.HasPrefix(line, "anomaly ") {
					out.WriteString(line)
				}
			}
			return out.String()
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
			list := s.Anomalies
			if d.HasArg("tail") {
				var n int
				d.ScanArgs(t, "tail", &n)
				fmt.Fprintf(&out, "kept=%d", len(list))
				if len(list) > 0 {
					fmt.Fprintf(&out, " oldest_seq=%d", list[0].Seq)
				}
				out.WriteByte('\n')
				list = list[max(0, len(list)-n):]
			}
			for _, a := range list {
				fmt.Fprintf(&out, "seq=%d term=%d writer=%s type=%s %s: %s\n", a.Seq, a.Term, a.Writer, a.Type, a.Kind, a.Reason)
			}
			if out.Len() == 0 {
				return "none\n"
			}
			return out.String()
		case "history":
			var out strings.Builder
			list := s.History
			if d.HasArg("tail") {
				var n int
				d.ScanArgs(t, "tail", &n)
				fmt.Fprintf(&out, "kept=%d", len(list))
				if len(list) > 0 {
					fmt.Fprintf(&out, " oldest=%s", list[0].ID)
				}
				out.WriteByte('\n')
				list = list[max(0, len(list)-n):]
			}
			for _, op := range list {
				fmt.Fprintf(&out, "%s shard=%d %s started=%d finished=%d\n", op.ID, op.Shard, op.State, op.Started, op.Finished)
			}
			if out.Len() == 0 {
				return "none\n"
			}
			return out.String()
		case "counters":
			c := s.Counters
			return fmt.Sprintf("applied=%d noops=%d rejected=%d stale_term=%d corrupt=%d anomalies=%d history=%d\n",
				c.Applied, c.NoOps, c.Rejected, c.StaleTerm, c.Corrupt, len(s.Anomalies), len(s.History))
		case "stale-flood":
			var n int
			d.ScanArgs(t, "n", &n)
			if s.Term == 0 && !d.HasArg("term") {
				d.Fatalf(t, "stale-flood needs a current term above 0 or term=")
			}
			term, writer := s.Term-1, "meta-stale"
			d.MaybeScanArgs(t, "term", &term)
			d.MaybeScanArgs(t, "writer", &writer)
			return flood(t, d, s, n, func(i int, seq uint64) []byte {
				body, err := scriptEvent(fmt.Sprintf(`%d %s worker.expired {"id":%d,"epoch":%d}`, term, writer, i+1, i+1), seq)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				return body
			})
		case "corrupt-flood":
			var n int
			d.ScanArgs(t, "n", &n)
			return flood(t, d, s, n, func(i int, _ uint64) []byte {
				return fmt.Appendf(nil, "garbage %d", i)
			})
		case "op-flood":
			var n int
			var shard uint64
			d.ScanArgs(t, "n", &n)
			d.ScanArgs(t, "shard", &shard)
			return flood(t, d, s, 2*n, func(i int, seq uint64) []byte {
				typ := "operator.started"
				if i%2 == 1 {
					typ = "operator.finished"
				}
				body, err := scriptEvent(fmt.Sprintf(`%d meta %s {"op":"op-flood-%d","shard":%d}`, s.Term, typ, i/2, shard), seq)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				return body
			})
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

// flood applies n generated bodies and summarizes the outcomes.
func flood(t *testing.T, d *datadriven.TestData, s *projections.State, n int, body func(i int, seq uint64) []byte) string {
	if n <= 0 {
		d.Fatalf(t, "n must be positive")
	}
	first := s.Seq + 1
	counts := map[projections.Outcome]int{}
	for i := range n {
		r := s.DecodeApply(s.Seq+1, body(i, s.Seq+1))
		counts[r.Outcome]++
	}
	var out strings.Builder
	fmt.Fprintf(&out, "seq %d..%d:", first, s.Seq)
	for o := projections.Applied; o <= projections.Duplicate; o++ {
		if counts[o] > 0 {
			fmt.Fprintf(&out, " %s=%d", o, counts[o])
		}
	}
	out.WriteByte('\n')
	return out.String()
}
