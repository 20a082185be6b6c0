package script

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/termlog/termlog/projections"
)

// Arg is one argument of a command line: key, key=val or key=(a, b).
type Arg struct {
	Key  string
	Vals []string
}

func (a Arg) String() string {
	switch len(a.Vals) {
	case 0:
		return a.Key
	case 1:
		return a.Key + "=" + a.Vals[0]
	}
	return a.Key + "=(" + strings.Join(a.Vals, ", ") + ")"
}

// Fold runs the commands of a script against one state. The zero value is
// not usable: use NewFold.
type Fold struct {
	// State is the state the commands read and fold into.
	State *projections.State
	// OnEntry, when set, is called with the seq and body of every entry
	// folded (apply lines and the generated floods alike), before it is
	// folded. It lets a script be turned back into a log.
	OnEntry func(seq uint64, body []byte)
}

// NewFold returns a fold at the empty state.
func NewFold() *Fold { return &Fold{State: projections.New()} }

// ErrUnknownCommand is returned by Run for a command it does not know, so a
// caller with commands of its own can try them first or after.
var ErrUnknownCommand = errors.New("unknown command")

// Run runs one command with its arguments and input and returns its output.
// An error is a mistake in the script (a bad line, a missing argument), not
// an outcome of the fold: outcomes are output.
func (f *Fold) Run(cmd string, args []Arg, input string) (string, error) {
	s := f.State
	a := argSet(args)
	switch cmd {
	case "apply":
		return f.apply(input, a.has("quiet"))
	case "state":
		if !a.has("brief") {
			return s.Render(), nil
		}
		var out strings.Builder
		for _, line := range strings.SplitAfter(s.Render(), "\n") {
			if !strings.HasPrefix(line, "anomaly ") {
				out.WriteString(line)
			}
		}
		return out.String(), nil
	case "hash":
		return s.Hash() + "\n", nil
	case "workers":
		var out strings.Builder
		for _, w := range s.ListWorkers() {
			fmt.Fprintf(&out, "%d epoch=%d %s %s\n", w.ID, w.Epoch, w.Endpoint, w.State)
		}
		return orNone(out.String()), nil
	case "check":
		if err := s.CheckInvariants(); err != nil {
			return err.Error() + "\n", nil
		}
		return "ok\n", nil
	case "anomalies":
		var out strings.Builder
		list, err := tail(a, &out, s.Anomalies, func(an projections.Anomaly) string { return fmt.Sprintf("oldest_seq=%d", an.Seq) })
		if err != nil {
			return "", err
		}
		for _, an := range list {
			fmt.Fprintf(&out, "seq=%d term=%d writer=%s type=%s %s: %s\n", an.Seq, an.Term, an.Writer, an.Type, an.Kind, an.Reason)
		}
		return orNone(out.String()), nil
	case "history":
		var out strings.Builder
		list, err := tail(a, &out, s.History, func(op projections.Operator) string { return "oldest=" + op.ID })
		if err != nil {
			return "", err
		}
		for _, op := range list {
			fmt.Fprintf(&out, "%s shard=%d %s started=%d finished=%d\n", op.ID, op.Shard, op.State, op.Started, op.Finished)
		}
		return orNone(out.String()), nil
	case "counters":
		c := s.Counters
		return fmt.Sprintf("applied=%d noops=%d rejected=%d stale_term=%d corrupt=%d anomalies=%d history=%d\n",
			c.Applied, c.NoOps, c.Rejected, c.StaleTerm, c.Corrupt, len(s.Anomalies), len(s.History)), nil
	case "snapshot":
		got, err := projections.DecodeSnapshot(s.EncodeSnapshot())
		if err != nil {
			return err.Error() + "\n", nil
		}
		if got.Render() == s.Render() && got.Hash() == s.Hash() {
			return "same\n", nil
		}
		return "differs:\n" + got.Render(), nil
	case "stale-flood":
		n, err := a.int("n")
		if err != nil {
			return "", err
		}
		if s.Term == 0 && !a.has("term") {
			return "", errors.New("stale-flood needs a current term above 0 or term=")
		}
		term := s.Term - 1
		if a.has("term") {
			t, err := a.int("term")
			if err != nil {
				return "", err
			}
			term = uint64(t)
		}
		writer := "meta-stale"
		if a.has("writer") {
			writer = a.str("writer")
		}
		return f.flood(n, func(i int, seq uint64) []byte {
			return Entry{Term: term, Writer: writer, Type: "worker.expired", Data: fmt.Appendf(nil, `{"id":%d,"epoch":%d}`, i+1, i+1)}.Body(seq)
		})
	case "corrupt-flood":
		n, err := a.int("n")
		if err != nil {
			return "", err
		}
		return f.flood(n, func(i int, _ uint64) []byte { return fmt.Appendf(nil, "garbage %d", i) })
	case "op-flood":
		n, err := a.int("n")
		if err != nil {
			return "", err
		}
		shard, err := a.int("shard")
		if err != nil {
			return "", err
		}
		writer := s.Leader // the term's leader writes its operators
		if writer == "" {
			writer = "meta"
		}
		return f.flood(2*n, func(i int, seq uint64) []byte {
			typ := "operator.started"
			if i%2 == 1 {
				typ = "operator.finished"
			}
			return Entry{Term: s.Term, Writer: writer, Type: typ, Data: fmt.Appendf(nil, `{"op":"op-flood-%d","shard":%d}`, i/2, shard)}.Body(seq)
		})
	}
	return "", fmt.Errorf("%w %q", ErrUnknownCommand, cmd)
}

// fold folds one body at seq.
func (f *Fold) fold(seq uint64, body []byte) projections.Result {
	if f.OnEntry != nil {
		f.OnEntry(seq, body)
	}
	return f.State.DecodeApply(seq, body)
}

// apply folds the entries of input, one a line ('#' lines and blank lines
// skipped), and prints "<seq> <outcome>" for each, or with quiet one
// summary line.
func (f *Fold) apply(input string, quiet bool) (string, error) {
	var out strings.Builder
	sum := newSummary()
	for i, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := ParseEntry(line)
		if err != nil {
			return "", fmt.Errorf("input line %d: %w", i+1, err)
		}
		seq := e.Seq
		if seq == 0 {
			seq = f.State.Seq + 1
		}
		r := f.fold(seq, e.Body(seq))
		if quiet {
			sum.add(seq, r)
		} else {
			fmt.Fprintf(&out, "%d %s\n", seq, r)
		}
	}
	if quiet {
		return sum.String(), nil
	}
	return orNone(out.String()), nil
}

// flood folds n generated bodies and summarizes the outcomes.
func (f *Fold) flood(n int, body func(i int, seq uint64) []byte) (string, error) {
	if n <= 0 {
		return "", errors.New("n must be positive")
	}
	sum := newSummary()
	for i := range n {
		seq := f.State.Seq + 1
		sum.add(seq, f.fold(seq, body(i, seq)))
	}
	return sum.String(), nil
}

// summary counts outcomes over a range of seqs: "seq 1..9: applied=8 rejected=1".
type summary struct {
	first, last uint64
	n           int
	counts      map[projections.Outcome]int
}

func newSummary() *summary { return &summary{counts: map[projections.Outcome]int{}} }

func (s *summary) add(seq uint64, r projections.Result) {
	if s.n == 0 || seq < s.first {
		s.first = seq
	}
	s.last = max(s.last, seq)
	s.n++
	s.counts[r.Outcome]++
}

func (s *summary) String() string {
	if s.n == 0 {
		return "none\n"
	}
	var out strings.Builder
	fmt.Fprintf(&out, "seq %d..%d:", s.first, s.last)
	for o := projections.Applied; o <= projections.Duplicate; o++ {
		if s.counts[o] > 0 {
			fmt.Fprintf(&out, " %s=%d", o, s.counts[o])
		}
	}
	out.WriteByte('\n')
	return out.String()
}

func orNone(s string) string {
	if s == "" {
		return "none\n"
	}
	return s
}

type argSet []Arg

func (a argSet) get(key string) (Arg, bool) {
	for _, x := range a {
		if x.Key == key {
			return x, true
		}
	}
	return Arg{}, false
}

func (a argSet) has(key string) bool { _, ok := a.get(key); return ok }

func (a argSet) str(key string) string {
	x, _ := a.get(key)
	if len(x.Vals) == 0 {
		return ""
	}
	return x.Vals[0]
}

func (a argSet) int(key string) (int, error) {
	x, ok := a.get(key)
	if !ok || len(x.Vals) != 1 {
		return 0, fmt.Errorf("want %s=<number>", key)
	}
	n, err := strconv.Atoi(x.Vals[0])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%s: want a number >= 0", key, x.Vals[0])
	}
	return n, nil
}

// tail applies a command's tail=n to a bounded list: it writes how many
// are kept and the oldest kept (oldest names it), and returns the newest n.
// Without tail it returns the list as is.
func tail[T any](a argSet, out *strings.Builder, list []T, oldest func(T) string) ([]T, error) {
	if !a.has("tail") {
		return list, nil
	}
	n, err := a.int("tail")
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "kept=%d", len(list))
	if len(list) > 0 {
		fmt.Fprintf(out, " %s", oldest(list[0]))
	}
	out.WriteByte('\n')
	return list[max(0, len(list)-n):], nil
}
