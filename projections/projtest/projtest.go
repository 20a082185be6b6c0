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
// Every script starts from the empty state; the commands run in order
// against one state.
//
// # Commands
//
//	apply [quiet]
//	    folds the events of its input, one a line (blank lines and lines
//	    starting with # are skipped), and prints "<seq> <outcome>" for each:
//	    "applied: <what changed>", "noop: <why>", "rejected <kind>: <why>",
//	    "corrupt: <decode error>" or "duplicate: <why>". With quiet
//	    it prints one line instead: "seq A..B: applied=N noop=N ...".
//	state [brief]
//	    the whole state as projections.State.Render prints it: a header
//	    (seq, term, leader, next_worker_id, at), a line per worker, store,
//	    shard, running and ended operator, the counters and the anomalies;
//	    brief leaves out the anomalies
//	hash
//	    the state hash (the one replicas and snapshots compare)
//	workers
//	    the active workers, the list_workers view: "<id> epoch=<e> <endpoint> <state>"
//	check
//	    the invariants: "ok" or the violations
//	anomalies [tail=N]
//	    the rejected and corrupt events kept; with tail, how many are kept,
//	    the oldest kept seq, and only the newest N
//	history [tail=N]
//	    the ended operators (with tail: how many kept, the oldest, the newest N)
//	counters
//	    the counters and the sizes of the bounded lists
//	snapshot
//	    encodes the state as a snapshot, decodes it, and prints "same" when
//	    the decoded state renders and hashes the same
//	stale-flood n=N [term=T] [writer=W]
//	    folds N worker.expired events at term T (default: the current term
//	    - 1) and prints the seq range and the outcomes, as apply quiet
//	corrupt-flood n=N
//	    folds N bodies that are not JSON; prints as stale-flood
//	op-flood n=N shard=ID
//	    starts and finishes N operators op-flood-<i> on a shard in the
//	    current term; prints as stale-flood
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
// ("worker.registered", ...) and the data object as JSON. Without seq= the
// entry takes the next seq (the state's seq + 1); a seq at or below the
// state's is a duplicate, one above the next leaves a gap, as in a damaged
// file. Without at= the event happens at 2026-11-30T03:00:00Z plus seq
// seconds. A raw line is a body stored as is — not JSON, a forged envelope,
// a type this build does not know — folded as the live stream folds it; raw64
// carries a body that is not one line of UTF-8.
//
// # Example
//
// A complete script: the first report's handoff, where the outgoing
// leader's expiry lands after the new leader's term.started.
//
//	# meta-1 leads term 1; worker 1 registers at 10.0.0.5:5688 and runs.
//	apply
//	1 meta-1 term.started {"term":1,"leader":"meta-1"}
//	1 meta-1 worker.registered {"id":1,"incarnation":"cn-a","endpoint":"10.0.0.5:5688","kind":"compute","parallelism":4}
//	1 meta-1 worker.activated {"id":1,"epoch":2}
//	----
//	1 applied: term 1 leader meta-1
//	2 applied: worker 1 epoch 2 at 10.0.0.5:5688
//	3 applied: worker 1 running
//
//	# meta-2 takes over; meta-1's expiry, decided under term 1, is stale.
//	apply
//	at=2026-11-30T03:00:04.5Z 7 meta-2 term.started {"term":7,"leader":"meta-2"}
//	1 meta-1 worker.expired {"id":1,"epoch":2}
//	seq=9 raw this is not json
//	----
//	4 applied: term 7 leader meta-2
//	5 rejected stale-term: term 1 < current term 7
//	9 corrupt: seq 9: malformed event: invalid character 'h' in literal true (expecting 'r')
//
//	workers
//	----
//	1 epoch=2 10.0.0.5:5688 running
//
//	state
//	----
//	seq=9 term=7 leader=meta-2 next_worker_id=2 at=2026-11-30T03:00:04.5Z
//	worker 1 epoch=2 running endpoint=10.0.0.5:5688 inc=cn-a kind=compute par=4 term=1
//	counters applied=4 noops=0 rejected=1 stale_term=1 corrupt=1
//	anomaly seq=5 term=1 writer=meta-1 type=worker.expired stale-term: term 1 < current term 7
//	anomaly seq=9 term=0 writer=- type=- corrupt: seq 9: malformed event: invalid character 'h' in literal true (expecting 'r')
//
// # Go API
//
// RunFile and RunDir run scripts with the commands above. A test with
// commands of its own wraps Fold.Handle:
//
//	f := projtest.New()
//	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
//		if d.Cmd == "leader-view" {
//			return myView(f.State())
//		}
//		return f.Handle(t, d)
//	})
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
