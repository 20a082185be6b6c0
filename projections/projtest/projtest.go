// Package projtest runs projection scripts — events in, outcomes and state
// out — against the fold of package projections, from the tests of any
// package. A script is a datadriven file (github.com/cockroachdb/datadriven):
// commands, their input, and the output they are expected to print. Run the
// tests with -rewrite to write today's output into the files, then read
// every changed line before committing it.
//
//	func TestIncidents(t *testing.T) { projtest.RunDir(t, "testdata/incidents") }
//
// `termlog replay --file F.jsonl --to-script F.txt` writes a script from an
// exported log (see the README, "From incident to unit test"), and
// `termlog replay --from-script F.txt` turns a script back into JSONL.
//
// # Grammar
//
// A script is a sequence of commands. Lines starting with # before a command
// are comments. Each command is
//
//	<command> [arg | arg=val | arg=(v1, v2)]...
//	<input lines, for apply>
//	----
//	<expected output>
//	<a blank line>
//
// An expected output that holds a blank line is written between two "----"
// lines and closed by two "----" lines (datadriven's -rewrite does this).
// Every script starts from the empty state, in the view named main; the
// commands run in order against the current view. A command, an argument or
// a data field the kit does not know fails the test, naming the line and
// the words it knows (a typo such as "state breif" or "epoc" would otherwise
// test something else than it says).
//
// # Commands
//
//	apply [quiet]
//	    folds the events of its input, one a line (blank lines and lines
//	    starting with # are skipped), and prints "<seq> <outcome>" for each:
//	    "applied: <what changed>", "noop: <why>", "rejected <kind>: <why>"
//	    (kind: stale-term, future-term, stale-lease, invalid), "corrupt:
//	    <decode error>" or "duplicate: <why>"; an applied or no-op event of
//	    the current term that its leader did not write ends with "; warning
//	    writer-mismatch: ..." (it is kept as an anomaly too). With quiet it
//	    prints one line instead: "seq A..B: applied=N noop=N ...".
//	state [brief]
//	    the whole state as projections.State.Render prints it: a header
//	    (seq, term, leader, lease, next_worker_id, at), a line per worker,
//	    store, shard, running and ended operator, the counters and the
//	    anomalies; brief leaves out the anomalies
//	hash
//	    the state hash (the one replicas and snapshots compare)
//	workers
//	    the active workers, the list_workers view: "<id> epoch=<e> <endpoint> <state>"
//	check
//	    the check of `termlog replay --check`, over every entry folded into
//	    the view: the seqs run 1, 2, 3, ... (a gap, a swap or a duplicate
//	    fails) and the term and seq never go back, at every entry; the
//	    invariants hold after every command that folds, and when they do not
//	    the command's entries are folded again to name the entry after which
//	    they first failed (a break that heals within one command goes
//	    unseen: replay --check checks after every entry). It prints "ok" or
//	    the first failure in replay's words:
//	    "check failed at seq 5, event 3: seq 5 leaves a gap: seqs 3..4 are missing"
//	anomalies [tail=N]
//	    the rejected, corrupt and writer-mismatch events kept; with tail, how
//	    many are kept, the oldest kept seq, and only the newest N
//	history [tail=N]
//	    the ended operators (with tail: how many kept, the oldest, the newest N)
//	counters
//	    the counters and the sizes of the bounded lists
//	snapshot [name=S]
//	    encodes the state as a snapshot, decodes it, and prints "same" when
//	    the decoded state renders and hashes the same; with name, keeps the
//	    snapshot as S (for restore) and prints its seq and hash
//	restore name=S
//	    replaces the current view's state with snapshot S, as a replica that
//	    starts from a snapshot does; its check continues from S's seq + 1
//	replica <name> [from=<view>]
//	    makes <name> the current view: a new one starts empty (or, with from,
//	    as a copy of that view), an existing one where it was; "replica main"
//	    returns to the first view. Views fold independently, so two replicas
//	    can be folded to different seqs or fed different entries
//	compare <view> <view>
//	    "same: seq N hash H" when the two views' states hash alike; otherwise
//	    each view's seq and hash and the state lines only one of them has
//	stale-flood n=N [term=T] [writer=W]
//	    folds N worker.expired events at term T (default: the current term
//	    - 1) and prints the seq range and the outcomes, as apply quiet
//	corrupt-flood n=N
//	    folds N bodies that are not JSON; prints as stale-flood
//	op-flood n=N shard=ID
//	    starts and finishes N operators op-flood-<i> on a shard in the
//	    current term, written by its leader; prints as stale-flood
//
// A test adds commands of its own with WithCommand (see the Go API).
//
// # Event lines
//
// Each input line of apply is one entry of the log:
//
//	[seq=<n>] [at=<RFC3339 time>] <term> <writer> <type> <json data>
//	[seq=<n>] raw <body>
//	[seq=<n>] raw64 <standard base64 of the body>
//
// An event line is the envelope of one event: its term, the writer (a bare
// word, or a Go-quoted string when empty or holding spaces), the type
// ("worker.registered", ...) and the data object as JSON. The fields of each
// type's data, and what the fold does with them, are listed by
// `go doc ./events` (the package doc: "Event kinds and their fields").
// Without seq= the entry takes the next seq (the state's seq + 1); a seq at
// or below the state's is a duplicate, one above the next leaves a gap, as
// in a damaged file (check reports both). Without at= the event happens at
// 2026-11-30T03:00:00Z plus seq seconds; at= is kept as written. A raw line
// is a body stored as is — not JSON, a forged envelope, a type this build
// does not know — folded as the live stream folds it; raw64 carries a body
// that is not one line of UTF-8.
//
// Terms count leaders (1, 2, 3, ...); a term.started names its leader and
// the lease it holds:
//
//	2 meta-2 term.started {"term":2,"leader":"meta-2","lease":9}
//
// The lease (the revision of the lease key meta-2 created) is the fencing
// token: once a term was started under a lease, a term.started whose lease
// is not newer is a deposed holder's and is rejected as stale-lease, even
// though its term is above the current one. A term.started without a lease
// is a log from before leases; scripts of today's logs should carry one.
// Every event of a term is written by its leader: the term's other events
// name the leader as writer (another writer is a writer-mismatch).
//
// # Worked example: a late expiry from the previous term
//
// The first report's handoff, as a test. The outgoing leader meta-1 decided
// to expire worker 1 in term 1, but its append lands after meta-2 took the
// lease and started term 2. The expiry must be rejected (stale-term) and
// worker 1 must stay; the deposed meta-1 then cannot start a term of its
// own with its old lease (stale-lease). Write the file as
// testdata/late-expiry next to a test that calls RunDir (see the Go API),
// leave the outputs under each "----" empty, run `go test -rewrite`, and
// read what the kit wrote: this is it.
//
//	# meta-1 leads term 1 under lease 5; worker 1 registers at 10.0.0.5:5688
//	# and runs.
//	apply
//	1 meta-1 term.started {"term":1,"leader":"meta-1","lease":5}
//	1 meta-1 worker.registered {"id":1,"incarnation":"cn-a","endpoint":"10.0.0.5:5688","kind":"compute","parallelism":4}
//	1 meta-1 worker.activated {"id":1,"epoch":2}
//	----
//	1 applied: term 1 leader meta-1 lease 5
//	2 applied: worker 1 epoch 2 at 10.0.0.5:5688
//	3 applied: worker 1 running
//
//	# meta-1 stalls past its lease; meta-2 takes the lease (revision 9) and
//	# starts term 2. meta-1's expiry, decided under term 1, lands after it.
//	apply
//	at=2026-11-30T03:00:04.5Z 2 meta-2 term.started {"term":2,"leader":"meta-2","lease":9}
//	1 meta-1 worker.expired {"id":1,"epoch":2}
//	----
//	4 applied: term 2 leader meta-2 lease 9
//	5 rejected stale-term: term 1 < current term 2
//
//	# meta-1 wakes and starts term 3 under its old lease; a torn record follows.
//	apply
//	3 meta-1 term.started {"term":3,"leader":"meta-1","lease":5}
//	raw this is not json
//	----
//	6 rejected stale-lease: term 3 lease 5 <= current term 2's lease 9
//	7 corrupt: seq 7: malformed event: invalid character 'h' in literal true (expecting 'r')
//
//	# Worker 1 is still there, and the log holds together.
//	workers
//	----
//	1 epoch=2 10.0.0.5:5688 running
//
//	check
//	----
//	ok
//
//	state
//	----
//	seq=7 term=2 leader=meta-2 lease=9 next_worker_id=2 at=2026-11-30T03:00:04.5Z
//	worker 1 epoch=2 running endpoint=10.0.0.5:5688 inc=cn-a kind=compute par=4 term=1
//	counters applied=4 noops=0 rejected=2 stale_term=1 corrupt=1
//	anomaly seq=5 term=1 writer=meta-1 type=worker.expired stale-term: term 1 < current term 2
//	anomaly seq=6 term=3 writer=meta-1 type=term.started stale-lease: term 3 lease 5 <= current term 2's lease 9
//	anomaly seq=7 term=0 writer=- type=- corrupt: seq 7: malformed event: invalid character 'h' in literal true (expecting 'r')
//
// Had the fold applied the stale expiry, the test would fail naming seq 5,
// with "5 applied: worker 1 epoch 2 removed" where the script expects the
// rejection, and the workers command would print "none".
//
// The test that runs it, in any package (the file at testdata/late-expiry):
//
//	package incidents_test
//
//	import (
//		"testing"
//
//		"github.com/termlog/termlog/projections/projtest"
//	)
//
//	func TestLateExpiry(t *testing.T) { projtest.RunFile(t, "testdata/late-expiry") }
//
// and `go test -run TestLateExpiry -rewrite ./incidents/` writes the
// outputs; without -rewrite it checks them.
//
// # Go API
//
// RunFile and RunDir run scripts with the commands above; New and
// Fold.Handle run one command at a time inside a datadriven.RunTest of the
// test's own. A test with commands of its own adds them with WithCommand,
// without wrapping Handle:
//
//	func TestIncidents(t *testing.T) {
//		leaderView := func(s *projections.State, d *datadriven.TestData) (string, error) {
//			return fmt.Sprintf("%s leads term %d\n", s.Leader, s.Term), nil
//		}
//		projtest.RunDir(t, "testdata", projtest.WithCommand("leader-view", leaderView))
//	}
//
// A command of the test's own sees the current view's state, as the kit's
// commands do, and a mistake in the script is its error (the test fails
// naming the line). Its name must not be one of the kit's.
package projtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/projections/projtest/script"
)

// Fold is the state one script runs against: its views and their states.
type Fold struct {
	f    *script.Fold
	cmds map[string]Command
	err  error // a bad option, reported by the first Handle
}

// Command is a script command of a test's own (see WithCommand). It gets
// the current view's state and the command as datadriven parsed it (d.Cmd,
// d.CmdArgs, d.Input, d.Pos) and returns the output the script expects. A
// mistake in the script is an error: the test fails naming the line.
type Command func(s *projections.State, d *datadriven.TestData) (string, error)

// An Option configures a Fold (New, RunFile, RunDir).
type Option func(*Fold)

// WithCommand adds a command of the test's own to the kit's, under a name
// the kit does not use. It runs against the current view (main, or the one
// the last replica command chose), so it sees what the kit's commands see.
func WithCommand(name string, c Command) Option {
	return func(f *Fold) {
		switch {
		case slices.Contains(script.Commands(), name):
			f.err = fmt.Errorf("projtest.WithCommand(%q): the kit has a command of that name (%s)", name, strings.Join(script.Commands(), ", "))
		case name == "" || strings.ContainsAny(name, " \t\n=") || c == nil:
			f.err = fmt.Errorf("projtest.WithCommand(%q): want a command name without spaces and a function", name)
		default:
			f.cmds[name] = c
		}
	}
}

// New returns a fold at the empty state, with the kit's commands and the
// options' own.
func New(opts ...Option) *Fold {
	f := &Fold{f: script.NewFold(), cmds: map[string]Command{}}
	for _, o := range opts {
		o(f)
	}
	return f
}

// State is the state of the current view (the fold's own).
func (f *Fold) State() *projections.State { return f.f.State }

// Handle runs one datadriven command and returns its output; it fails the
// test on a mistake in the script (an unknown command or argument, a bad
// line), naming the file and line.
func (f *Fold) Handle(t *testing.T, d *datadriven.TestData) string {
	t.Helper()
	if f.err != nil {
		t.Fatal(f.err)
	}
	if c, ok := f.cmds[d.Cmd]; ok {
		out, err := c(f.f.State, d)
		if err != nil {
			d.Fatalf(t, "%s: %v", d.Cmd, err)
		}
		return out
	}
	args := make([]script.Arg, len(d.CmdArgs))
	for i, a := range d.CmdArgs {
		args[i] = script.Arg{Key: a.Key, Vals: a.Vals}
	}
	out, err := f.f.Run(d.Cmd, args, d.Input)
	if err != nil {
		if len(f.cmds) > 0 {
			keys := mapsKeys(f.cmds)
			slices.Sort(keys)
			err = fmt.Errorf("%w; this test's own: %s", err, strings.Join(keys, ", "))
		}
		d.Fatalf(t, "%s: %v", d.Cmd, err)
	}
	return out
}

func mapsKeys(m map[string]Command) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// RunFile runs the script at path from the empty state. With -rewrite it
// writes today's output into the file.
func RunFile(t *testing.T, path string, opts ...Option) {
	t.Helper()
	f := New(opts...)
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		return f.Handle(t, d)
	})
}

// RunDir runs every file at the top of dir as a subtest named after it
// (sub-directories, such as a fuzz corpus, are left alone), each from the
// empty state.
func RunDir(t *testing.T, dir string, opts ...Option) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		n++
		t.Run(e.Name(), func(t *testing.T) { RunFile(t, filepath.Join(dir, e.Name()), opts...) })
	}
	if n == 0 {
		t.Fatalf("no script in %s", dir)
	}
}
