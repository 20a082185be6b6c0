package sched_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

// t0 is the scripts' time zero.
var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// world is a script's state: the projection the decisions read, the
// leader's memory and store reports, the clock, and the execs in flight.
type world struct {
	v        *projections.State
	mem      sched.Memory
	reports  map[string]sched.Report
	now      time.Time
	term     uint64
	leader   string
	cfg      sched.Config
	inFlight map[uint64]sched.Exec
	appended int // events the decisions appended
}

func newWorld() *world {
	return &world{v: projections.New(), reports: map[string]sched.Report{}, now: t0, inFlight: map[uint64]sched.Exec{},
		cfg: sched.Config{Shards: 1, Replicas: 3, StoreTimeout: 5 * time.Second, StepTimeout: 10 * time.Second, Backoff: time.Second, BackoffMax: 8 * time.Second}}
}

// append folds payloads as the leader's events; it returns the outcomes.
func (w *world) append(term uint64, writer string, ps ...events.Payload) []string {
	var out []string
	for _, p := range ps {
		ev := events.Event{Seq: w.v.Seq + 1, Term: term, Writer: writer, At: w.now, Data: p}
		b, err := events.Encode(ev)
		if err != nil {
			out = append(out, "encode: "+err.Error())
			continue
		}
		r := w.v.DecodeApply(ev.Seq, b)
		out = append(out, fmt.Sprintf("%d %s", ev.Seq, r))
	}
	return out
}

// newTerm makes writer the leader of the next term: term.started, and a
// leader's fresh memory (no reports, nothing in flight).
func (w *world) newTerm(writer string) string {
	w.term = w.v.Term + 1
	w.leader = writer
	w.mem = sched.Memory{}
	w.reports = map[string]sched.Report{}
	w.inFlight = map[uint64]sched.Exec{}
	return strings.Join(w.append(w.term, writer, events.TermStarted{Term: w.term, Leader: writer}), "\n")
}

// decide runs passes until one appends nothing (as the leader's loop does).
func (w *world) decide() string {
	var b strings.Builder
	for pass := 1; pass <= 8; pass++ {
		out := sched.Decide(sched.Input{View: w.v, Reports: w.reports, Memory: w.mem, Now: w.now, Term: w.term, Config: w.cfg})
		w.mem = out.Memory
		for _, p := range out.Events {
			b.WriteString(renderPayload(p))
			b.WriteByte('\n')
		}
		if res := w.append(w.term, w.leader, out.Events...); len(res) > 0 {
			for _, r := range res {
				if !strings.Contains(r, " applied") {
					fmt.Fprintf(&b, "  !! %s\n", r)
				}
			}
		}
		w.appended += len(out.Events)
		for _, x := range out.Execs {
			fmt.Fprintf(&b, "exec %s deadline=+%s\n", x, x.Deadline.Sub(w.now))
			w.inFlight[x.Req.Shard] = x
		}
		if len(out.Events) == 0 {
			break
		}
	}
	if b.Len() == 0 {
		return "nothing\n"
	}
	return b.String()
}

func renderPayload(p events.Payload) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
	return p.Type() + " " + strings.TrimSpace(b.String())
}

func parseReplicas(s string) (map[uint64]string, error) {
	m := map[uint64]string{}
	if s == "" {
		return m, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("replica %q: want id=addr", kv)
		}
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return nil, err
		}
		m[id] = v
	}
	return m, nil
}

// fields parses "k=v k=v" into a map.
func fields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func u64(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }

func (w *world) health() string {
	out := sched.Decide(sched.Input{View: w.v, Reports: w.reports, Memory: w.mem, Now: w.now, Term: w.term, Config: w.cfg})
	var b strings.Builder
	for _, st := range out.Health.Stores {
		fmt.Fprintf(&b, "store %s %s live=%v replicas=%d", st.Store, st.State, st.Live, st.Replicas)
		if st.Stopped {
			b.WriteString(" stopped")
		}
		b.WriteByte('\n')
	}
	if len(out.Health.Collecting) > 0 {
		fmt.Fprintf(&b, "collecting %s\n", strings.Join(out.Health.Collecting, " "))
	}
	for _, h := range out.Health.Shards {
		fmt.Fprintf(&b, "shard %d running=%d/%d members=%s leader=%d", h.Shard, h.Live, h.Expected, renderMembers(h.Members), h.Leader)
		if h.LeaderStore != "" {
			fmt.Fprintf(&b, "@%s", h.LeaderStore)
		}
		if h.Operator != "" {
			fmt.Fprintf(&b, " operator=%s", h.Operator)
		}
		if len(h.Pending) > 0 {
			fmt.Fprintf(&b, " pending=%q", h.Pending)
		}
		if h.Blocked != "" {
			fmt.Fprintf(&b, " blocked=%q", h.Blocked)
		}
		if len(h.Zombies) > 0 {
			fmt.Fprintf(&b, " zombies=%v", h.Zombies)
		}
		fmt.Fprintf(&b, " healthy=%v", h.Healthy)
		if h.Why != "" {
			fmt.Fprintf(&b, " (%s)", h.Why)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func renderMembers(m map[uint64]string) string {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%d:%s", id, m[id])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// TestScripts runs testdata/*: the scheduler's decisions, pinned.
//
//	config k=v...        shards, replicas, store-timeout, step-timeout, backoff, backoff-max
//	leader id=<meta>     a new leader term (term.started, fresh memory)
//	apply                events of the current term, one per line: "<type> <json data>"
//	register id=<store> addr=<raft addr>
//	                     store.registered (incarnation i-<store>) and its report
//	report store=<id>    a heartbeat now; each line one running replica:
//	                     shard=<n> replica=<n> leader=<n> term=<n> ccid=<n> replicas=<id=addr,...>
//	                     (a line "skipped shard=<n> replica=<n>" is a refused zombie)
//	advance <duration>   moves the clock
//	decide               decision passes until one appends nothing: events and execs
//	result shard=<n> outcome=<o> [ccid=<n>] [replicas=<id=addr,...>] [error=<text>] [index=<n>]
//	                     the in-flight exec of the shard came back
//	health               the health the next decision reports
//	state                the projected shards and operators
//	count                events appended by decisions so far
func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.IsDir() {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			w := newWorld()
			datadriven.RunTest(t, f, func(t *testing.T, d *datadriven.TestData) string { return w.run(t, d) })
		})
	}
}

func (w *world) run(t *testing.T, d *datadriven.TestData) string {
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	dur := func(k string, into *time.Duration) {
		if v, ok := args[k]; ok {
			x, err := time.ParseDuration(v)
			if err != nil {
				d.Fatalf(t, "%s: %v", k, err)
			}
			*into = x
		}
	}
	switch d.Cmd {
	case "config":
		if v, ok := args["shards"]; ok {
			w.cfg.Shards = int(u64(v))
		}
		if v, ok := args["replicas"]; ok {
			w.cfg.Replicas = int(u64(v))
		}
		dur("store-timeout", &w.cfg.StoreTimeout)
		dur("step-timeout", &w.cfg.StepTimeout)
		dur("backoff", &w.cfg.Backoff)
		dur("backoff-max", &w.cfg.BackoffMax)
		return "ok\n"
	case "leader":
		return w.newTerm(args["id"]) + "\n"
	case "apply":
		var ps []events.Payload
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			typ, data, _ := strings.Cut(strings.TrimSpace(line), " ")
			b, err := json.Marshal(map[string]any{"v": 1, "term": w.term, "writer": w.leader, "at": w.now, "type": typ, "data": json.RawMessage(data)})
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			ev, err := events.Decode(1, b)
			if err != nil {
				d.Fatalf(t, "%s: %v", line, err)
			}
			ps = append(ps, ev.Data)
		}
		return strings.Join(w.append(w.term, w.leader, ps...), "\n") + "\n"
	case "register":
		id := args["id"]
		res := w.append(w.term, w.leader, events.StoreRegistered{Store: id, Incarnation: "i-" + id, RaftAddr: args["addr"]})
		w.reports[id] = sched.Report{Incarnation: "i-" + id, At: w.now}
		return strings.Join(res, "\n") + "\n"
	case "report":
		id := args["store"]
		rep := sched.Report{Incarnation: "i-" + id, At: w.now}
		if inc, ok := args["inc"]; ok {
			rep.Incarnation = inc
		}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			if rest, ok := strings.CutPrefix(line, "skipped "); ok {
				f := fields(rest)
				rep.Skipped = append(rep.Skipped, client.SkippedReplica{Shard: u64(f["shard"]), Replica: u64(f["replica"]), Reason: "not a member in the view"})
				continue
			}
			f := fields(line)
			reps, err := parseReplicas(f["replicas"])
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			rep.Shards = append(rep.Shards, client.ShardReport{Shard: u64(f["shard"]), Replica: u64(f["replica"]), Leader: u64(f["leader"]),
				Term: u64(f["term"]), CCID: u64(f["ccid"]), Replicas: reps})
		}
		w.reports[id] = rep
		return "ok\n"
	case "advance":
		x, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		w.now = w.now.Add(x)
		return fmt.Sprintf("now +%s\n", w.now.Sub(t0))
	case "decide":
		return w.decide()
	case "result":
		shard := u64(args["shard"])
		x, ok := w.inFlight[shard]
		if !ok {
			return fmt.Sprintf("no exec in flight for shard %d\n", shard)
		}
		delete(w.inFlight, shard)
		reps, err := parseReplicas(args["replicas"])
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		if len(reps) == 0 {
			reps = nil
		}
		w.mem = w.mem.WithResult(sched.Result{Exec: x, At: w.now, Reply: client.ExecReply{Outcome: args["outcome"], CCID: u64(args["ccid"]), Replicas: reps, Error: args["error"], Index: u64(args["index"])}})
		return "ok\n"
	case "health":
		return w.health()
	case "state":
		var b strings.Builder
		for _, line := range strings.Split(w.v.Render(), "\n") {
			if strings.HasPrefix(line, "shard ") || strings.HasPrefix(line, "operator ") || strings.HasPrefix(line, "store ") {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
		return b.String()
	case "count":
		return fmt.Sprintf("%d events appended by decisions (seq %d)\n", w.appended, w.v.Seq)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}
