package decide_test

import (
	"encoding/json"
	"errors"
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
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/projections"
)

// t0 is the scripts' time zero.
var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// world is a script's state: what the leader's shell gathers for the
// decisions (the projected view, its liveness memory, its connection, the
// clock) and does with what they return (append the events, apply the
// deadline changes), as meta's leaderSession does.
type world struct {
	v      *projections.State
	live   *decide.Liveness // the leader's liveness memory, as meta keeps it
	conn   decide.Conn
	now    time.Time
	term   uint64
	leader string
	cfg    decide.Config
}

func newWorld() *world {
	c := decide.Conn{Connected: true}
	return &world{v: projections.New(), live: decide.NewLiveness(c), conn: c,
		now: t0, cfg: decide.Config{WorkerTimeout: 10 * time.Second}}
}

// commit folds payloads as the leader's events, as the committer does (one
// encoding each, folded into a copy of the view): it renders each as
// "append <type> <data>". When the fold refuses one, the committer appends
// none of the decision's events and fails it: the view is unchanged, the
// reply is unavailable, and commit returns false.
func (w *world) commit(b *strings.Builder, ps ...events.Payload) bool {
	if len(ps) == 0 {
		return true
	}
	st := w.v.Clone()
	for _, p := range ps {
		fmt.Fprintf(b, "append %s\n", renderPayload(p))
		_, body, err := events.Seal(events.Event{Term: w.term, Writer: w.leader, At: w.now, Data: p})
		if err != nil {
			fmt.Fprintf(b, "  !! encode: %v\n", err)
			return false
		}
		if r := st.DecodeApply(st.Seq+1, body); r.Outcome == projections.Rejected || r.Outcome == projections.Corrupt {
			fmt.Fprintf(b, "  !! the fold refuses it: %s\nnothing appended\nreply %s: the projection refuses the leader's own event\n", r, client.CodeUnavailable)
			return false
		}
	}
	w.v = st
	return true
}

func renderPayload(p events.Payload) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
	return p.Type() + " " + strings.TrimSpace(b.String())
}

func renderReply(rep client.Reply) string {
	if rep.Error != nil {
		return fmt.Sprintf("reply %s: %s\n", rep.Error.Code, rep.Error.Message)
	}
	if rep.ID == 0 && rep.Epoch == 0 {
		return "reply ok\n"
	}
	return fmt.Sprintf("reply ok id=%d epoch=%d\n", rep.ID, rep.Epoch)
}

// at renders a time relative to t0.
func at(t time.Time) string { return "+" + t.Sub(t0).String() }

// renew sets the deadline the shell grants a worker answered ok.
func (w *world) renew(b *strings.Builder, id, epoch uint64) {
	w.live.Renew(id, epoch, w.now, w.cfg)
	d := w.live.Deadlines[id]
	fmt.Fprintf(b, "deadline %d epoch=%d at=%s\n", id, epoch, at(d.At))
}

type args map[string]string

func (a args) u64(t *testing.T, d *datadriven.TestData, k string) uint64 {
	v, ok := a[k]
	if !ok {
		d.Fatalf(t, "%s: missing %s=", d.Cmd, k)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		d.Fatalf(t, "%s=%s: %v", k, v, err)
	}
	return n
}

func (a args) dur(t *testing.T, d *datadriven.TestData, k string) time.Duration {
	x, err := time.ParseDuration(a[k])
	if err != nil {
		d.Fatalf(t, "%s=%s: %v", k, a[k], err)
	}
	return x
}

func (a args) ref(t *testing.T, d *datadriven.TestData) client.WorkerRef {
	return client.WorkerRef{ID: a.u64(t, d, "id"), Epoch: a.u64(t, d, "epoch"), Incarnation: a["incarnation"]}
}

// handler runs one script command.
type handler func(t *testing.T, w *world, d *datadriven.TestData, a args) string

// handlers is the script language, one handler per command:
//
//	leader id=<meta>          the next term: term.started, a fresh memory
//	                          (no deadlines: a new leader grants fresh
//	                          timeouts), reconnect count as the connection's
//	apply                     events of the current term, one a line:
//	                          "<type> <json data>"
//	advance <duration>        moves the clock
//	conn [connected=<bool>] [reconnects=<n>]
//	                          the leader's NATS connection as the shell
//	                          will see it ("none": no connection)
//	register incarnation=<s> endpoint=<host:port> [kind=<s>] [parallelism=<n>]
//	activate|deregister|heartbeat id=<n> epoch=<n> incarnation=<s>
//	expire                    one expiry tick
//	deadlines                 the leader's deadlines
//	workers                   the projected workers
//	store-register store=<s> incarnation=<s> addr=<raft addr>
//	store-heartbeat store=<s> incarnation=<s>
//	store-drain store=<s> for=<duration>
//	store-selfdrain store=<s> incarnation=<s> for=<duration>
//	stores                    the projected stores
//	group                     registrations decided together, as the
//	                          committer groups them: each line a register
//	                          or store-register command, decided in order
//	                          on the view with the events of those before
//	                          it; every reply judged on the view after the
//	                          whole group
var handlers = map[string]handler{
	"leader":          cmdLeader,
	"apply":           cmdApply,
	"advance":         cmdAdvance,
	"conn":            cmdConn,
	"register":        cmdRegister,
	"activate":        cmdActivate,
	"deregister":      cmdDeregister,
	"heartbeat":       cmdHeartbeat,
	"expire":          cmdExpire,
	"deadlines":       cmdDeadlines,
	"workers":         cmdRender("worker "),
	"stores":          cmdRender("store "),
	"store-register":  cmdStoreRegister,
	"store-heartbeat": cmdStoreHeartbeat,
	"store-drain":     cmdStoreDrain,
	"store-selfdrain": cmdStoreSelfDrain,
	"group":           cmdGroup,
}

// TestScripts runs testdata/*: the leader's worker and store decisions,
// pinned. Each script starts from an empty view at t0, a connected
// connection and a worker timeout of 10s.
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
			w := newWorld()
			datadriven.RunTest(t, f, func(t *testing.T, d *datadriven.TestData) string {
				h, ok := handlers[d.Cmd]
				if !ok {
					d.Fatalf(t, "unknown command %q", d.Cmd)
				}
				a := args{}
				for _, arg := range d.CmdArgs {
					a[arg.Key] = strings.Join(arg.Vals, ",")
				}
				return h(t, w, d, a)
			})
		})
	}
}

func cmdLeader(_ *testing.T, w *world, _ *datadriven.TestData, a args) string {
	w.term = w.v.Term + 1
	w.leader = a["id"]
	w.live = decide.NewLiveness(w.conn)
	var b strings.Builder
	w.commit(&b, events.TermStarted{Term: w.term, Leader: w.leader})
	return b.String()
}

func cmdApply(t *testing.T, w *world, d *datadriven.TestData, _ args) string {
	var ps []events.Payload
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		typ, data, _ := strings.Cut(strings.TrimSpace(line), " ")
		body, err := json.Marshal(map[string]any{"v": 1, "term": w.term, "writer": w.leader, "at": w.now, "type": typ, "data": json.RawMessage(data)})
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		ev, err := events.Decode(1, body)
		if err != nil {
			d.Fatalf(t, "%s: %v", line, err)
		}
		ps = append(ps, ev.Data)
	}
	var b strings.Builder
	w.commit(&b, ps...)
	return b.String()
}

func cmdAdvance(t *testing.T, w *world, d *datadriven.TestData, _ args) string {
	x, err := time.ParseDuration(d.CmdArgs[0].Key)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	w.now = w.now.Add(x)
	return fmt.Sprintf("now %s\n", at(w.now))
}

func cmdConn(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	if _, ok := a["none"]; ok {
		w.conn = decide.Conn{None: true}
		return "no connection\n"
	}
	w.conn.None = false
	if v, ok := a["connected"]; ok {
		c, err := strconv.ParseBool(v)
		if err != nil {
			d.Fatalf(t, "connected=%s: %v", v, err)
		}
		w.conn.Connected = c
	}
	if _, ok := a["reconnects"]; ok {
		w.conn.Reconnects = a.u64(t, d, "reconnects")
	}
	return fmt.Sprintf("connected=%v reconnects=%d\n", w.conn.Connected, w.conn.Reconnects)
}

func cmdRegister(_ *testing.T, w *world, _ *datadriven.TestData, a args) string {
	req := client.RegisterRequest{Incarnation: a["incarnation"], Endpoint: a["endpoint"], Kind: a["kind"]}
	if p, err := strconv.Atoi(a["parallelism"]); err == nil {
		req.Parallelism = p
	}
	return w.request(decide.Register(w.v, req))
}

// request runs a decision as the shell's decideRequest does.
func (w *world) request(dec decide.Decision) string {
	var b strings.Builder
	if !w.commit(&b, dec.Events...) {
		return b.String()
	}
	w.answer(&b, dec, w.v.Seq)
	return b.String()
}

// answer renders a decision's reply once its events are stored, seen
// being the seq it saw (its own events included), and renews the worker
// when it says so.
func (w *world) answer(b *strings.Builder, dec decide.Decision, seen uint64) {
	if dec.EpochAtSeq {
		dec.Reply.Epoch = seen
	}
	b.WriteString(renderReply(dec.Reply))
	if dec.Renew {
		w.renew(b, dec.Reply.ID, dec.Reply.Epoch)
	}
}

func cmdActivate(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	dec := decide.Activate(w.v, a.ref(t, d))
	return refused(dec.Reply) + w.request(dec)
}

func cmdDeregister(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	dec := decide.Deregister(w.v, a.ref(t, d))
	return refused(dec.Reply) + w.request(dec)
}

// refused is what the RPC server logs for a worker's request it answers
// forbidden (rpcServer.logForbidden): the line, or nothing.
func refused(rep client.Reply) string {
	if rep.Error != nil && rep.Error.Code == client.CodeForbidden {
		return "log: refused, another incarnation's registration\n"
	}
	return ""
}

// heard renders a hearing decision the leader's memory applied.
func heard(b *strings.Builder, h decide.Hearing) {
	if h.Back {
		fmt.Fprintf(b, "connection back (reconnects=%d): every deadline at least %s\n", h.Reconnects, at(h.Floor))
	}
}

func cmdHeartbeat(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	ref := a.ref(t, d)
	wk, found := w.v.Worker(ref.ID)
	var b strings.Builder
	rep, h := w.live.Beat(wk, found, ref, w.conn, w.now, w.cfg)
	heard(&b, h)
	b.WriteString(refused(rep))
	b.WriteString(renderReply(rep))
	if rep.Error == nil {
		dl := w.live.Deadlines[ref.ID]
		fmt.Fprintf(&b, "deadline %d epoch=%d at=%s\n", ref.ID, dl.Epoch, at(dl.At))
	}
	return b.String()
}

func cmdExpire(_ *testing.T, w *world, _ *datadriven.TestData, _ args) string {
	var b strings.Builder
	x, h := w.live.Expire(w.v, w.conn, w.now, w.cfg)
	heard(&b, h)
	if !h.Hearing {
		b.WriteString("not hearing: nothing expires\n")
		return b.String()
	}
	for _, g := range x.Grant {
		fmt.Fprintf(&b, "grant %d epoch=%d at=%s\n", g.ID, g.Deadline.Epoch, at(g.Deadline.At))
	}
	for _, id := range x.Drop {
		fmt.Fprintf(&b, "drop %d\n", id)
	}
	w.commit(&b, x.Events...)
	if b.Len() == 0 {
		return "nothing\n"
	}
	return b.String()
}

func cmdDeadlines(_ *testing.T, w *world, _ *datadriven.TestData, _ args) string {
	ids := make([]uint64, 0, len(w.live.Deadlines))
	for id := range w.live.Deadlines {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var b strings.Builder
	for _, id := range ids {
		d := w.live.Deadlines[id]
		fmt.Fprintf(&b, "deadline %d epoch=%d at=%s\n", id, d.Epoch, at(d.At))
	}
	if b.Len() == 0 {
		return "none\n"
	}
	return b.String()
}

func cmdRender(prefix string) handler {
	return func(_ *testing.T, w *world, _ *datadriven.TestData, _ args) string {
		var b strings.Builder
		for _, line := range strings.Split(w.v.Render(), "\n") {
			if strings.HasPrefix(line, prefix) {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
		if b.Len() == 0 {
			return "none\n"
		}
		return b.String()
	}
}

func cmdStoreRegister(_ *testing.T, w *world, _ *datadriven.TestData, a args) string {
	req := client.StoreRegisterRequest{Store: a["store"], Incarnation: a["incarnation"], RaftAddr: a["addr"]}
	var b strings.Builder
	dec := decide.StoreRegister(w.v, req)
	if !w.commit(&b, dec.Events...) {
		return b.String()
	}
	b.WriteString(renderReply(dec.Reply))
	if dec.Renew {
		fmt.Fprintf(&b, "report %s incarnation=%s at=%s\n", req.Store, req.Incarnation, at(w.now))
	}
	return b.String()
}

func cmdStoreHeartbeat(_ *testing.T, w *world, _ *datadriven.TestData, a args) string {
	hb := client.StoreHeartbeat{Store: a["store"], Incarnation: a["incarnation"]}
	rep, ok := decide.StoreHeartbeat(w.v, hb)
	out := renderReply(rep)
	if ok {
		out += fmt.Sprintf("report %s incarnation=%s at=%s\n", hb.Store, hb.Incarnation, at(w.now))
	}
	return out
}

func cmdStoreDrain(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	req := client.DrainRequest{Store: a["store"], ForMS: a.dur(t, d, "for").Milliseconds()}
	return w.request(decide.StoreDrain(w.v, req, w.now))
}

func cmdStoreSelfDrain(t *testing.T, w *world, d *datadriven.TestData, a args) string {
	req := client.SelfDrainRequest{Store: a["store"], Incarnation: a["incarnation"], ForMS: a.dur(t, d, "for").Milliseconds()}
	return w.request(decide.StoreSelfDrain(w.v, req, w.now))
}

func cmdGroup(t *testing.T, w *world, d *datadriven.TestData, _ args) string {
	var b strings.Builder
	var answers []func()
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		cmd, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		a := args{}
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			a[k] = v
		}
		switch cmd {
		case "register":
			req := client.RegisterRequest{Incarnation: a["incarnation"], Endpoint: a["endpoint"]}
			dec := decide.Register(w.v, req)
			if !w.commit(&b, dec.Events...) {
				continue
			}
			seen := w.v.Seq
			answers = append(answers, func() {
				fmt.Fprintf(&b, "%s: ", line)
				w.answer(&b, dec, seen)
			})
		case "store-register":
			req := client.StoreRegisterRequest{Store: a["store"], Incarnation: a["incarnation"], RaftAddr: a["addr"]}
			dec := decide.StoreRegister(w.v, req)
			if !w.commit(&b, dec.Events...) {
				continue
			}
			answers = append(answers, func() { fmt.Fprintf(&b, "%s: %s", line, renderReply(dec.Reply)) })
		default:
			d.Fatalf(t, "group: %q is not a register or store-register", line)
		}
	}
	for _, answer := range answers {
		answer()
	}
	return b.String()
}

// TestBadRequest: the reply names the cause.
func TestBadRequest(t *testing.T) {
	rep := decide.BadRequest(errors.New("unknown rpc \"x\""))
	if rep.Error == nil || rep.Error.Code != client.CodeBadRequest || rep.Error.Message != `unknown rpc "x"` {
		t.Fatalf("got %+v", rep.Error)
	}
}
