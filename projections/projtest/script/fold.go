package script

import (
	"errors"
	"fmt"
	"maps"
	"slices"
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

// Fold runs the commands of a script against its views: the main view, and
// the replicas a "replica <name>" command opens. Use NewFold; a Fold built
// by hand folds into its State as the main view.
type Fold struct {
	// State is the state of the current view: the commands read and fold
	// into it (the main view's until a replica command).
	State *projections.State
	// OnEntry, when set, is called with the seq and body of every entry
	// folded (apply lines and the generated floods alike), before it is
	// folded. It lets a script be turned back into a log; View says which
	// view the entry is folded into.
	OnEntry func(seq uint64, body []byte)

	cur   *view
	views map[string]*view
	snaps map[string][]byte

	// base is the current view's state before the running command, while
	// its check has found nothing; block the entries it folded since.
	base  *projections.State
	block []pending
}

// MainView is the name of the view a script starts in.
const MainView = "main"

type view struct {
	name  string
	state *projections.State
	chk   Checker
	first error // the first check failure over the entries folded
	// firstAt is where the check found it: 2n before entry n is folded
	// (the seqs), 2n+1 after it (the step rules and the invariants).
	firstAt uint64
}

// pending is an entry folded by the running command, kept to trace an
// invariant failure to the entry after which it began.
type pending struct {
	seq  uint64
	body []byte
	n    uint64 // its place among the view's entries
}

// NewFold returns a fold whose main view is at the empty state.
func NewFold() *Fold {
	v := &view{name: MainView, state: projections.New()}
	return &Fold{State: v.state, cur: v, views: map[string]*view{MainView: v}, snaps: map[string][]byte{}}
}

// View is the name of the current view.
func (f *Fold) View() string {
	f.sync()
	return f.cur.name
}

// sync adopts a State its user replaced.
func (f *Fold) sync() {
	if f.State == nil {
		f.State = projections.New()
	}
	if f.cur == nil { // a Fold{State: s} built by hand: s is its main view
		v := &view{name: MainView, state: f.State}
		v.chk.Restart(f.State.Seq + 1)
		f.cur, f.views, f.snaps = v, map[string]*view{MainView: v}, map[string][]byte{}
	}
	if f.State != f.cur.state {
		f.cur.state = f.State
		f.cur.chk.Restart(f.State.Seq + 1)
		f.cur.first = nil
	}
}

// ErrUnknownCommand is returned by Run for a command it does not know, so a
// caller with commands of its own can try them first or after.
var ErrUnknownCommand = errors.New("unknown command")

// commandArgs lists the arguments each command of the kit takes.
var commandArgs = map[string][]string{
	"apply":         {"quiet"},
	"state":         {"brief"},
	"hash":          nil,
	"workers":       nil,
	"check":         nil,
	"anomalies":     {"tail"},
	"history":       {"tail"},
	"counters":      nil,
	"snapshot":      {"name"},
	"restore":       {"name"},
	"replica":       nil, // replica <name> [from=<view>]: checked by the command
	"compare":       nil, // compare <view> <view>
	"stale-flood":   {"n", "term", "writer"},
	"corrupt-flood": {"n"},
	"op-flood":      {"n", "shard"},
}

// Commands lists the kit's commands, sorted.
func Commands() []string {
	out := make([]string, 0, len(commandArgs))
	for c := range commandArgs {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// checkArgs refuses an argument the command does not take, naming the
// ones it does.
func checkArgs(cmd string, args []Arg) error {
	if cmd == "replica" || cmd == "compare" {
		return nil
	}
	known := commandArgs[cmd]
	for _, a := range args {
		if slices.Contains(known, a.Key) {
			continue
		}
		if len(known) == 0 {
			return fmt.Errorf("unknown argument %q: %s takes none", a.String(), cmd)
		}
		return fmt.Errorf("unknown argument %q: %s takes %s", a.String(), cmd, strings.Join(known, ", "))
	}
	return nil
}

// Run runs one command with its arguments and input and returns its output.
// An error is a mistake in the script (a bad line, a missing or unknown
// argument), not an outcome of the fold: outcomes are output.
func (f *Fold) Run(cmd string, args []Arg, input string) (string, error) {
	f.sync()
	if _, ok := commandArgs[cmd]; !ok {
		return "", fmt.Errorf("%w %q (the kit's commands: %s)", ErrUnknownCommand, cmd, strings.Join(Commands(), ", "))
	}
	if err := checkArgs(cmd, args); err != nil {
		return "", err
	}
	s := f.State
	a := argSet(args)
	switch cmd {
	case "apply":
		return f.folding(func() (string, error) { return f.apply(input, a.has("quiet")) })
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
		return f.check(), nil
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
		b := s.EncodeSnapshot()
		got, err := projections.DecodeSnapshot(b)
		if err != nil {
			return err.Error() + "\n", nil
		}
		if got.Render() != s.Render() || got.Hash() != s.Hash() {
			return "differs:\n" + got.Render(), nil
		}
		if !a.has("name") {
			return "same\n", nil
		}
		name, err := a.word("name")
		if err != nil {
			return "", err
		}
		f.snaps[name] = b
		return fmt.Sprintf("same; kept as %s: seq %d hash %s\n", name, s.Seq, s.Hash()), nil
	case "restore":
		name, err := a.word("name")
		if err != nil {
			return "", err
		}
		b, ok := f.snaps[name]
		if !ok {
			return "", fmt.Errorf("no snapshot %q (kept: %s)", name, orNoneList(slices.Sorted(maps.Keys(f.snaps))))
		}
		st, err := projections.DecodeSnapshot(b)
		if err != nil { // it decoded when it was taken
			return err.Error() + "\n", nil
		}
		f.setState(st)
		return fmt.Sprintf("%s restored from %s: seq %d hash %s\n", f.cur.name, name, st.Seq, st.Hash()), nil
	case "replica":
		return f.replica(args)
	case "compare":
		return f.compare(args)
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
	return "", fmt.Errorf("%w %q", ErrUnknownCommand, cmd) // listed in commandArgs, not handled: cannot happen
}

// setState makes st the current view's state, checked from its seq on.
func (f *Fold) setState(st *projections.State) {
	f.cur.state, f.State = st, st
	f.cur.chk.Restart(st.Seq + 1)
	f.cur.first = nil
}

// replica switches to the view named by its one bare argument, opening it
// at the empty state, or with from=<view> as a copy of that view's state.
func (f *Fold) replica(args []Arg) (string, error) {
	var name, from string
	for _, a := range args {
		switch {
		case a.Key == "from" && len(a.Vals) == 1:
			from = a.Vals[0]
		case len(a.Vals) == 0 && name == "":
			name = a.Key
		default:
			return "", fmt.Errorf("unknown argument %q: replica takes a view name and from=<view>", a.String())
		}
	}
	if name == "" {
		return "", errors.New("replica needs a view name: replica <name> [from=<view>]")
	}
	v, ok := f.views[name]
	switch {
	case ok && from != "":
		return "", fmt.Errorf("replica %s exists already: from= opens a new one", name)
	case ok:
		f.cur, f.State = v, v.state
		return fmt.Sprintf("replica %s at seq %d\n", name, v.state.Seq), nil
	}
	v = &view{name: name, state: projections.New()}
	if from != "" {
		src, ok := f.views[from]
		if !ok {
			return "", fmt.Errorf("replica %s from=%s: no view %s (views: %s)", name, from, from, strings.Join(slices.Sorted(maps.Keys(f.views)), ", "))
		}
		v.state = src.state.Clone()
		v.chk = src.chk.clone()
		v.first, v.firstAt = src.first, src.firstAt
	}
	f.views[name] = v
	f.cur, f.State = v, v.state
	if from != "" {
		return fmt.Sprintf("replica %s opened as a copy of %s at seq %d\n", name, from, v.state.Seq), nil
	}
	return fmt.Sprintf("replica %s opened at seq 0\n", name), nil
}

// compare prints "same" for two views whose states hash alike, or where
// they differ: each view's seq and hash, then the lines of the rendered
// state that only one of them has.
func (f *Fold) compare(args []Arg) (string, error) {
	var names []string
	for _, a := range args {
		if len(a.Vals) != 0 {
			return "", fmt.Errorf("unknown argument %q: compare takes two view names", a.String())
		}
		names = append(names, a.Key)
	}
	if len(names) != 2 {
		return "", errors.New("compare takes two view names: compare <view> <view>")
	}
	var vs [2]*view
	for i, n := range names {
		v, ok := f.views[n]
		if !ok {
			return "", fmt.Errorf("compare: no view %s (views: %s)", n, strings.Join(slices.Sorted(maps.Keys(f.views)), ", "))
		}
		vs[i] = v
	}
	a, b := vs[0].state, vs[1].state
	if a.Hash() == b.Hash() {
		return fmt.Sprintf("same: seq %d hash %s\n", a.Seq, a.Hash()), nil
	}
	var out strings.Builder
	fmt.Fprintf(&out, "differ: %s at seq %d hash %s, %s at seq %d hash %s\n", names[0], a.Seq, a.Hash(), names[1], b.Seq, b.Hash())
	la, lb := strings.Split(strings.TrimSuffix(a.Render(), "\n"), "\n"), strings.Split(strings.TrimSuffix(b.Render(), "\n"), "\n")
	only := func(name string, x, y []string) {
		left := map[string]int{}
		for _, l := range y {
			left[l]++
		}
		for _, l := range x {
			if left[l] > 0 {
				left[l]--
				continue
			}
			fmt.Fprintf(&out, "%s only: %s\n", name, l)
		}
	}
	only(names[0], la, lb)
	only(names[1], lb, la)
	return out.String(), nil
}

// check is the check command: the first failure of the checker over the
// entries folded into the view (as replay --check words it), a jump in the
// seqs nothing explained yet, or the invariants of the state as it is.
func (f *Fold) check() string {
	v := f.cur
	if v.first != nil {
		return v.first.Error() + "\n"
	}
	if err := v.chk.End(); err != nil {
		return err.Error() + "\n"
	}
	if err := f.State.CheckInvariants(); err != nil {
		return err.Error() + "\n"
	}
	return "ok\n"
}

// fold folds one body at seq.
func (f *Fold) fold(seq uint64, body []byte) projections.Result {
	if f.OnEntry != nil {
		f.OnEntry(seq, body)
	}
	v, s := f.cur, f.State
	before := s.Provenance
	err := v.chk.Before(seq, 0)
	at := 2 * v.chk.Count()
	r := s.DecodeApply(seq, body)
	if err == nil {
		err, at = v.chk.Step(seq, 0, before, s), at+1
	}
	if f.base != nil {
		f.block = append(f.block, pending{seq: seq, body: body, n: v.chk.Count()})
	}
	if v.first == nil && err != nil {
		v.first, v.firstAt = err, at
	}
	return r
}

// folding runs a command that folds entries (apply, the floods) with the
// check of replay --check: the seqs and the step rules are checked at every
// entry; the invariants, which read the whole state, after the command, and
// when they fail (or another failure was found meanwhile) the command's
// entries are folded again from the state before it, checking the
// invariants after each, so the failure names the entry after which they
// first failed — what replay --check reports — at the cost of one check per
// command rather than one per entry.
func (f *Fold) folding(run func() (string, error)) (string, error) {
	v := f.cur
	f.base, f.block = nil, f.block[:0]
	if v.first == nil {
		f.base = f.State.Clone()
	}
	out, err := run()
	base := f.base
	f.base = nil
	if base == nil || err != nil {
		return out, err
	}
	if v.first == nil && f.State.CheckInvariants() == nil {
		return out, nil
	}
	for _, p := range f.block {
		if v.first != nil && 2*p.n+1 > v.firstAt {
			break
		}
		base.DecodeApply(p.seq, p.body)
		if ierr := base.CheckInvariants(); ierr != nil {
			seq := p.seq
			if seq == 0 {
				seq = base.Seq
			}
			v.first, v.firstAt = &CheckError{Seq: seq, Events: p.n, Err: ierr}, 2*p.n+1
			break
		}
	}
	return out, nil
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
		if err == nil {
			err = e.checkFields()
		}
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
	return f.folding(func() (string, error) {
		sum := newSummary()
		for i := range n {
			seq := f.State.Seq + 1
			sum.add(seq, f.fold(seq, body(i, seq)))
		}
		return sum.String(), nil
	})
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

// word is the one value of key, a name.
func (a argSet) word(key string) (string, error) {
	x, ok := a.get(key)
	if !ok || len(x.Vals) != 1 || x.Vals[0] == "" {
		return "", fmt.Errorf("want %s=<name>", key)
	}
	return x.Vals[0], nil
}

func orNoneList(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
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
