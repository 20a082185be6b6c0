package group_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/meta/group"
	"github.com/termlog/termlog/projections"
)

// t0 is the scripts' time.
var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// world is a script's state, kept as meta's committer keeps it: the
// projection of what the log stored, the scratch state the next group is
// decided on (nil: a fresh copy of the projection), the queue and the
// groups in flight.
type world struct {
	proj    *projections.State
	scratch *projections.State
	term    uint64
	leader  string
	queue   []req
	flights []*flight
	// unsure is a group whose outcome stayed unknown: resent (same ids)
	// before the next group is decided.
	unsure *flight
	prior  group.Prior // the outcome of the last group settled, for the next one chained to it
}

// req is a queued mutation as a script names it.
type req struct {
	line string
	m    group.Mutation
	reg  *registration // a register request: its reply is judged once stored
}

type registration struct {
	req client.RegisterRequest
	d   decide.Decision
}

// flight is a group sent and not settled.
type flight struct {
	g     group.Group
	reqs  []req
	after *flight // the group in flight before it, if any
	out   *group.Outcome
}

// handlers is the script language:
//
//	leader id=<meta>   the next term: term.started stored, scratch dropped
//	other id=<meta>    another replica's term.started stored (a new leader:
//	                   this one's next append is fenced)
//	plan               queue the input's mutations (one a line), then plan
//	                   one group from the queue head and send it; lines:
//	                     register incarnation=<s> endpoint=<host:port>
//	                     registers n=<count>   (distinct new workers)
//	                     refused               (decides an event the fold refuses)
//	                     fails                 (the decision returns an error)
//	                     gone                  (its submitter's context ended)
//	                     gated register ...    (a failpoint follows its decision)
//	settle             the oldest group in flight, one attempt's outcome a
//	                   line: ok | fenced | timeout | timeout-stored |
//	                   notsent (timeout-stored: stored, the ack lost)
//	resend             the unsure group, attempts as for settle
//	workers            the projected workers (count=true: how many)
var handlers = map[string]func(t *testing.T, w *world, d *datadriven.TestData) string{
	"leader":  cmdLeader,
	"other":   cmdOther,
	"plan":    cmdPlan,
	"settle":  cmdSettle,
	"resend":  cmdResend,
	"workers": cmdWorkers,
}

// TestScripts runs testdata/*: the committer's planning and settling,
// pinned.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.IsDir() {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			w := &world{proj: projections.New()}
			datadriven.RunTest(t, f, func(t *testing.T, d *datadriven.TestData) string {
				h, ok := handlers[d.Cmd]
				if !ok {
					d.Fatalf(t, "unknown command %q", d.Cmd)
				}
				return h(t, w, d)
			})
		})
	}
}

func arg(d *datadriven.TestData, k string) string {
	for _, a := range d.CmdArgs {
		if a.Key == k {
			return strings.Join(a.Vals, ",")
		}
	}
	return ""
}

// store folds evs into the projection, as the log stores them.
func (w *world) store(t *testing.T, evs ...events.Event) {
	for _, ev := range evs {
		body, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if r := w.proj.DecodeApply(w.proj.Seq+1, body); r.Outcome != projections.Applied {
			t.Fatalf("store: %s", r)
		}
	}
}

func sealed(t *testing.T, term uint64, writer string, p events.Payload) events.Event {
	ev, _, err := events.Seal(events.Event{Term: term, Writer: writer, At: t0, Data: p})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func cmdLeader(t *testing.T, w *world, d *datadriven.TestData) string {
	w.term, w.leader = w.proj.Term+1, arg(d, "id")
	w.store(t, sealed(t, w.term, w.leader, events.TermStarted{Term: w.term, Leader: w.leader}))
	w.scratch, w.flights, w.unsure, w.prior = nil, nil, nil, group.Prior{}
	return fmt.Sprintf("term %d leader %s at seq %d\n", w.term, w.leader, w.proj.Seq)
}

func cmdOther(t *testing.T, w *world, d *datadriven.TestData) string {
	term := w.proj.Term + 1
	w.store(t, sealed(t, term, arg(d, "id"), events.TermStarted{Term: term, Leader: arg(d, "id")}))
	return fmt.Sprintf("term %d leader %s at seq %d\n", term, arg(d, "id"), w.proj.Seq)
}

// parse turns a plan line into queued mutations.
func parse(t *testing.T, d *datadriven.TestData, line string) []req {
	fields := strings.Fields(line)
	gated := len(fields) > 0 && fields[0] == "gated"
	if gated {
		fields = fields[1:]
	}
	a := map[string]string{}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		a[k] = v
	}
	var out []req
	switch fields[0] {
	case "register":
		out = append(out, register(line, client.RegisterRequest{Incarnation: a["incarnation"], Endpoint: a["endpoint"]}))
	case "registers":
		n, err := strconv.Atoi(a["n"])
		if err != nil {
			d.Fatalf(t, "%s: %v", line, err)
		}
		for i := range n {
			r := client.RegisterRequest{Incarnation: fmt.Sprintf("w%d", i), Endpoint: fmt.Sprintf("10.1.%d.%d:5688", i/250, i%250)}
			out = append(out, register(fmt.Sprintf("register incarnation=%s", r.Incarnation), r))
		}
	case "refused":
		// A term.started of the current term: the fold rejects it.
		out = append(out, req{line: line, m: group.Mutation{Decide: func(v *projections.State) ([]events.Payload, error) {
			return []events.Payload{events.TermStarted{Term: v.Term, Leader: "x"}}, nil
		}}})
	case "fails":
		out = append(out, req{line: line, m: group.Mutation{Decide: func(*projections.State) ([]events.Payload, error) {
			return nil, errors.New("the decision fails")
		}}})
	case "gone":
		out = append(out, req{line: line, m: group.Mutation{Gone: context.Canceled, Decide: func(*projections.State) ([]events.Payload, error) {
			panic("a gone mutation is decided")
		}}})
	default:
		d.Fatalf(t, "plan: unknown mutation %q", line)
	}
	for i := range out {
		out[i].m.Gated = gated
	}
	return out
}

// register is a register request decided as meta's shell decides it.
func register(line string, r client.RegisterRequest) req {
	reg := &registration{req: r}
	return req{line: line, reg: reg, m: group.Mutation{Decide: func(v *projections.State) ([]events.Payload, error) {
		reg.d = decide.Register(v, r)
		return reg.d.Events, nil
	}}}
}

func cmdPlan(t *testing.T, w *world, d *datadriven.TestData) string {
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			w.queue = append(w.queue, parse(t, d, line)...)
		}
	}
	var b strings.Builder
	if w.unsure != nil {
		b.WriteString("an outcome is unknown: resend it first\n")
		return b.String()
	}
	if w.scratch == nil {
		if len(w.flights) > 0 {
			return "scratch dropped: settle the groups in flight first\n"
		}
		w.scratch = w.proj.Clone()
	}
	pending := make([]group.Mutation, len(w.queue))
	for i, r := range w.queue {
		pending[i] = r.m
	}
	g := group.Plan(w.scratch, pending, group.Stamp{Term: w.term, Writer: w.leader, At: t0})
	f := &flight{g: g, reqs: w.queue[:len(g.Answers)]}
	w.queue = w.queue[len(g.Answers):]
	renderPlan(&b, f, len(w.queue))
	if g.DropScratch {
		w.scratch = nil
	}
	if n := len(w.flights); n > 0 {
		f.after = w.flights[n-1]
	}
	if len(g.Batch) > 0 || f.after != nil {
		w.flights = append(w.flights, f)
	}
	return b.String()
}

func renderPlan(b *strings.Builder, f *flight, queued int) {
	g := f.g
	fmt.Fprintf(b, "group of %d at base %d: %d events, %d queued\n", len(g.Answers), g.Base, len(g.Batch), queued)
	ids := group.MsgIDs(g.Base, g.Batch)
	for i, ev := range g.Batch {
		if len(g.Batch) > 6 && i >= 3 && i < len(g.Batch)-3 {
			if i == 3 {
				fmt.Fprintf(b, "... %d more\n", len(g.Batch)-6)
			}
			continue
		}
		body, _ := events.Encode(ev)
		fmt.Fprintf(b, "append %s %s\n", ids[i], body)
	}
	for i, a := range g.Answers {
		if elided(i, len(g.Answers)) {
			continue
		}
		switch {
		case a.Err != nil:
			fmt.Fprintf(b, "%s: failed: %v\n", f.reqs[i].line, a.Err)
		default:
			fmt.Fprintf(b, "%s: decided, sees seq %d\n", f.reqs[i].line, a.Seen)
		}
	}
	if g.DropScratch {
		b.WriteString("scratch dropped\n")
	}
	if g.Gate >= 0 {
		fmt.Fprintf(b, "failpoint after %s\n", f.reqs[g.Gate].line)
	}
}

// attempt turns a script line into one attempt's outcome, storing the
// batch when the line says it landed.
func (w *world) attempt(t *testing.T, d *datadriven.TestData, f *flight, line string) (uint64, error) {
	g := f.g
	top := g.Base + uint64(len(g.Batch))
	switch line {
	case "ok", "timeout-stored":
		if w.proj.Seq == top {
			// Stored by an earlier attempt: the log answers the
			// duplicate (same ids) with its seq.
			return top, nil
		}
		if w.proj.Seq != g.Base {
			return g.Base, fmt.Errorf("%w: wrong last sequence %d", events.ErrFenced, w.proj.Seq)
		}
		w.store(t, g.Batch...)
		if line == "ok" {
			return top, nil
		}
		return g.Base, errors.New("outcome unknown: context deadline exceeded")
	case "fenced":
		return g.Base, fmt.Errorf("%w: wrong last sequence %d", events.ErrFenced, w.proj.Seq)
	case "timeout":
		return g.Base, errors.New("outcome unknown: context deadline exceeded")
	case "notsent":
		return g.Base, fmt.Errorf("append at seq %d %w: NATS connection down", g.Base+1, group.ErrNotSent)
	}
	d.Fatalf(t, "unknown attempt %q", line)
	return 0, nil
}

// attempts feeds s the input's attempts, as the committer does.
func (w *world) attempts(t *testing.T, d *datadriven.TestData, b *strings.Builder, f *flight, s *group.Settling) {
	lines := strings.Fields(d.Input)
	for i, line := range lines {
		last, err := w.attempt(t, d, f, line)
		if !s.Attempted(last, err) {
			if i < len(lines)-1 {
				fmt.Fprintf(b, "not sent again: %d attempts ignored\n", len(lines)-1-i)
			}
			return
		}
		ids := group.MsgIDs(f.g.Base, f.g.Batch)
		fmt.Fprintf(b, "attempt %d: %v: send again at base %d with ids %s..%s\n", i+1, err, f.g.Base, ids[0], ids[len(ids)-1])
	}
	if len(lines) == 0 || !s.Done() {
		d.Fatalf(t, "settle: the attempts ran out before the outcome is known")
	}
}

func cmdSettle(t *testing.T, w *world, d *datadriven.TestData) string {
	if len(w.flights) == 0 {
		return "nothing in flight\n"
	}
	f := w.flights[0]
	w.flights = w.flights[1:]
	s := group.Settling{Base: f.g.Base, Events: len(f.g.Batch), Attempts: 3}
	if f.after != nil {
		s.Prior = group.Prior{Chained: true, Stored: f.after.out.Stored, Err: f.after.out.Err}
	}
	var b strings.Builder
	if len(f.g.Batch) > 0 {
		w.attempts(t, d, &b, f, &s)
	}
	o := s.Outcome()
	f.out = &o
	w.conclude(&b, f, o)
	return b.String()
}

func cmdResend(t *testing.T, w *world, d *datadriven.TestData) string {
	f := w.unsure
	if f == nil {
		return "nothing unsure\n"
	}
	s := group.Settling{Base: f.g.Base, Events: len(f.g.Batch), Attempts: 3, Resending: true}
	var b strings.Builder
	w.attempts(t, d, &b, f, &s)
	o := s.Outcome()
	if !o.Unsure {
		w.unsure = nil
	}
	renderOutcome(&b, o)
	return b.String()
}

// conclude applies a group's outcome as the committer does and renders
// every answer: a registration's reply as the shell gives it.
func (w *world) conclude(b *strings.Builder, f *flight, o group.Outcome) {
	renderOutcome(b, o)
	if o.Err != nil {
		w.scratch = nil // it holds events that may not be stored
	}
	if o.Unsure {
		w.unsure = f
	}
	for i, a := range f.g.Answers {
		r := f.reqs[i]
		if a.Err != nil || elided(i, len(f.g.Answers)) {
			continue // answered when planned, or not shown
		}
		if err := o.Answer(a.Seen); err != nil {
			fmt.Fprintf(b, "%s: reply unavailable: %v\n", r.line, err)
			continue
		}
		if r.reg == nil {
			fmt.Fprintf(b, "%s: ok\n", r.line)
			continue
		}
		rep := r.reg.d.Reply // as meta answers it: a new registration's epoch is its seq
		if r.reg.d.EpochAtSeq {
			rep.Epoch = a.Seen
		}
		if rep.Error != nil {
			fmt.Fprintf(b, "%s: reply %s: %s\n", r.line, rep.Error.Code, rep.Error.Message)
		} else {
			fmt.Fprintf(b, "%s: reply ok id=%d epoch=%d\n", r.line, rep.ID, rep.Epoch)
		}
	}
}

// elided: the i-th of n lines is not shown (the first and last three are).
func elided(i, n int) bool { return n > 6 && i >= 3 && i < n-3 }

func renderOutcome(b *strings.Builder, o group.Outcome) {
	if o.Err == nil {
		fmt.Fprintf(b, "stored up to %d\n", o.Stored)
	} else {
		fmt.Fprintf(b, "failed, stored up to %d: %v\n", o.Stored, o.Err)
	}
	if o.Unsure {
		b.WriteString("outcome unknown: resend before deciding anew\n")
	}
	if o.Fenced {
		b.WriteString("fenced: re-project\n")
	}
}

func cmdWorkers(_ *testing.T, w *world, d *datadriven.TestData) string {
	if arg(d, "count") == "true" {
		return fmt.Sprintf("%d workers, next id %d\n", len(w.proj.ListWorkers()), w.proj.NextWorkerID)
	}
	var b strings.Builder
	for _, line := range strings.Split(w.proj.Render(), "\n") {
		if strings.HasPrefix(line, "worker ") {
			b.WriteString(line + "\n")
		}
	}
	if b.Len() == 0 {
		return "none\n"
	}
	return b.String()
}
