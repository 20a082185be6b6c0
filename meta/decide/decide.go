// Package decide holds the meta leader's decisions on worker and store
// requests and on worker liveness, as pure functions: each takes the
// projected view (or the part of it that matters), the leader's liveness
// memory, the configuration and now, and returns the events to append and
// the reply. Nothing here reads a clock, a lock, a connection or a logger;
// the leader's shell (package meta) gathers those inputs, appends the events
// with the fence, applies the returned changes to its memory and answers.
//
// The scripts in testdata pin every decision (see decide_test.go).
package decide

import (
	"fmt"
	"sort"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// Config is what the decisions need of the replica's configuration.
type Config struct {
	// WorkerTimeout is how long a worker's registration lives without a
	// heartbeat.
	WorkerTimeout time.Duration
}

// Decision is what a request asks of the leader: append Events (in order,
// with the fence; none: nothing to append), then answer Reply once they are
// stored. Every request kind is decided once, in this shape. When Renew is
// set, the requester's liveness is renewed once the events are stored: a
// worker's (Reply.ID, Reply.Epoch) gets a fresh heartbeat deadline, a
// store's report is recorded.
type Decision struct {
	Events []events.Payload
	Reply  client.Reply
	Renew  bool
	// EpochAtSeq: the reply's epoch is the seq the decision's one event is
	// stored at (a new registration's epoch), which the shell learns once
	// it is stored: the seq the decision saw, its own event included.
	EpochAtSeq bool
}

// Reregister is the reply telling a worker its registration is gone.
func Reregister(ref client.WorkerRef) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeReregister, Message: fmt.Sprintf("no active worker %d epoch %d; register again", ref.ID, ref.Epoch)}}
}

// Forbidden is the reply refusing a request for a registration another
// incarnation made.
func Forbidden(ref client.WorkerRef) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeForbidden, Message: fmt.Sprintf("worker %d epoch %d was registered by another incarnation", ref.ID, ref.Epoch)}}
}

// BadRequest is the reply to a request that cannot be served as sent.
func BadRequest(err error) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeBadRequest, Message: err.Error()}}
}

func ok(id, epoch uint64) client.Reply { return client.Reply{ID: id, Epoch: epoch} }

// Owned checks a request's registration against the projected worker w
// (found: whether the view has ref.ID at all): nil when w is active with
// ref's epoch and was registered by ref's incarnation, else the reply
// refusing it (Reregister when there is no such worker, Forbidden when
// another incarnation registered it).
func Owned(w projections.Worker, found bool, ref client.WorkerRef) *client.Reply {
	if !found || w.Epoch != ref.Epoch {
		rep := Reregister(ref)
		return &rep
	}
	if w.Incarnation != ref.Incarnation {
		rep := Forbidden(ref)
		return &rep
	}
	return nil
}

func owned(v *projections.State, ref client.WorkerRef) *client.Reply {
	w, found := v.Worker(ref.ID)
	return Owned(w, found, ref)
}

// Register decides a register request on v: the same incarnation at the
// same endpoint gets its existing id and epoch back, nothing appended;
// anything else is a new registration with the view's next id (the fold
// removes any other worker at the endpoint in the same step), whose epoch
// is the seq its event is stored at (EpochAtSeq). Either way the worker is
// renewed. A worker replaced later in its own group still gets its id and
// epoch: it learns of the replacement at its next heartbeat, as if it came
// later.
func Register(v *projections.State, req client.RegisterRequest) Decision {
	// A lookup by endpoint: one active worker per endpoint, found in O(1),
	// where a search by incarnation scans every worker.
	if w, found := v.WorkerAt(req.Endpoint); found && w.Incarnation == req.Incarnation {
		return Decision{Reply: ok(w.ID, w.Epoch), Renew: true}
	}
	id := v.NextWorkerID
	return Decision{Reply: ok(id, 0), Renew: true, EpochAtSeq: true, Events: []events.Payload{events.WorkerRegistered{
		ID: id, Incarnation: req.Incarnation, Endpoint: req.Endpoint, Kind: req.Kind, Parallelism: req.Parallelism,
	}}}
}

// Activate decides an activate request: worker.activated for a Starting
// worker of ref's registration, nothing for one already Running; refused
// for any other registration. A worker answered ok is renewed.
func Activate(v *projections.State, ref client.WorkerRef) Decision {
	if rep := owned(v, ref); rep != nil {
		return Decision{Reply: *rep}
	}
	d := Decision{Reply: ok(ref.ID, ref.Epoch), Renew: true}
	if w, _ := v.Worker(ref.ID); w.State != projections.WorkerRunning {
		d.Events = []events.Payload{events.WorkerActivated{ID: ref.ID, Epoch: ref.Epoch}}
	}
	return d
}

// Deregister decides a deregister request. It is idempotent: a
// registration already gone is a success (nothing appended), but one
// registered by another incarnation is refused.
func Deregister(v *projections.State, ref client.WorkerRef) Decision {
	if rep := owned(v, ref); rep != nil {
		if rep.Error.Code == client.CodeReregister {
			return Decision{Reply: ok(ref.ID, ref.Epoch)} // gone already
		}
		return Decision{Reply: *rep}
	}
	return Decision{Reply: ok(ref.ID, ref.Epoch), Events: []events.Payload{events.WorkerDeregistered{ID: ref.ID, Epoch: ref.Epoch}}}
}

// Deadline is a worker's heartbeat deadline: the registration (epoch) it
// belongs to and the time after which that registration expires.
type Deadline struct {
	Epoch uint64
	At    time.Time
}

// Renewed is the deadline a heartbeat (or a registration or activation)
// at now grants registration epoch.
func Renewed(epoch uint64, now time.Time, cfg Config) Deadline {
	return Deadline{Epoch: epoch, At: now.Add(cfg.WorkerTimeout)}
}

// Heartbeat decides a worker heartbeat at now: w and found are the
// projected worker ref.ID (see Owned), d and has the deadline the leader
// holds for that id. A registration the view does not have, or another
// incarnation's, is refused (renew false). A heartbeat for the registration
// whose deadline passed (strictly before now) is too late: the worker must
// register again, and the expired deadline stays for the expiry to act on.
// Otherwise the registration is renewed: the shell sets Renewed(ref.Epoch,
// now, cfg).
func Heartbeat(w projections.Worker, found bool, ref client.WorkerRef, d Deadline, has bool, now time.Time) (rep client.Reply, renew bool) {
	if r := Owned(w, found, ref); r != nil {
		return *r, false
	}
	if has && d.Epoch == ref.Epoch && now.After(d.At) {
		return Reregister(ref), false
	}
	return ok(ref.ID, ref.Epoch), true
}

// Conn is the leader's NATS connection as the shell saw it.
type Conn struct {
	// None: the leader has no connection (an in-process test), so
	// heartbeats reach it whenever they are sent.
	None       bool
	Connected  bool
	Reconnects uint64 // the connection's reconnect count
}

// Hearing is the decision whether heartbeats can reach the leader, so that
// its deadlines mean something.
type Hearing struct {
	// Hearing is false while the connection is down: nothing may expire.
	Hearing bool
	// Back is set when the connection came back since the deadlines were
	// last valid (its reconnect count moved): every deadline is first
	// pushed to at least Floor = now + WorkerTimeout, as a new leader would
	// grant, and the leader remembers Reconnects.
	Back       bool
	Floor      time.Time
	Reconnects uint64
}

// Hear decides whether heartbeats reach the leader, given its connection
// now and the reconnect count it saw when its deadlines were last valid. A
// worker is expired only after a full timeout in which its heartbeats could
// have arrived. (A longer outage also ends the term, as the lease cannot be
// renewed, and the next term starts from fresh timeouts.)
func Hear(c Conn, seen uint64, now time.Time, cfg Config) Hearing {
	switch {
	case c.None:
		return Hearing{Hearing: true}
	case !c.Connected:
		return Hearing{}
	case c.Reconnects != seen:
		return Hearing{Hearing: true, Back: true, Floor: now.Add(cfg.WorkerTimeout), Reconnects: c.Reconnects}
	}
	return Hearing{Hearing: true}
}

// Grant is a deadline the expiry sets for a worker.
type Grant struct {
	ID       uint64
	Deadline Deadline
}

// Expiry is an expiry tick's decision.
type Expiry struct {
	// Events is worker.expired for every registration whose deadline
	// passed, by id and epoch, in id order: one fenced append.
	Events []events.Payload
	// Grant are fresh full timeouts for registrations without a deadline
	// (a new leader's first look, or a new epoch under an id).
	Grant []Grant
	// Drop are the deadlines of ids the view no longer has.
	Drop []uint64
}

// Expire decides an expiry tick at now on v with the leader's deadlines
// (only while hearing; see Hear — the shell pushes the deadlines to the
// floor first when the connection came back). A registration whose
// deadline is strictly before now expires; one at exactly its deadline does
// not yet.
func Expire(v *projections.State, deadlines map[uint64]Deadline, now time.Time, cfg Config) Expiry {
	var out Expiry
	// The map itself, not ListWorkers: a tick runs on the term's loop, and
	// a sorted copy of every worker was 2 MB and 7 ms a tick at 10,000
	// workers, heartbeats waiting behind it. The outputs are sorted below.
	for _, w := range v.Workers {
		if w == nil {
			continue
		}
		d, has := deadlines[w.ID]
		if !has || d.Epoch != w.Epoch {
			out.Grant = append(out.Grant, Grant{ID: w.ID, Deadline: Renewed(w.Epoch, now, cfg)})
			continue
		}
		if now.After(d.At) {
			out.Events = append(out.Events, events.WorkerExpired{ID: w.ID, Epoch: w.Epoch})
		}
	}
	for id := range deadlines {
		if _, found := v.Workers[id]; !found {
			out.Drop = append(out.Drop, id)
		}
	}
	sort.Slice(out.Events, func(i, j int) bool {
		return out.Events[i].(events.WorkerExpired).ID < out.Events[j].(events.WorkerExpired).ID
	})
	sort.Slice(out.Drop, func(i, j int) bool { return out.Drop[i] < out.Drop[j] })
	sort.Slice(out.Grant, func(i, j int) bool { return out.Grant[i].ID < out.Grant[j].ID })
	return out
}

// StoreRegister decides a store.register request on v: store.registered
// unless the store is already up with req's incarnation and raft address
// (a retry: nothing appended). Either way the reply is ok once the events
// are stored and the store's first report is recorded (Renew). The fold
// refuses a raft address another store holds, or a tombstone: then nothing
// is stored and the store retries. A store registered again later in its
// own group still gets ok: it learns of the replacement at its next
// heartbeat (reregister), as a worker does.
func StoreRegister(v *projections.State, req client.StoreRegisterRequest) Decision {
	if st, found := v.Stores[req.Store]; found && st.Incarnation == req.Incarnation && st.RaftAddr == req.RaftAddr && st.State == events.StoreUp {
		return Decision{Renew: true}
	}
	return Decision{Renew: true, Events: []events.Payload{events.StoreRegistered{Store: req.Store, Incarnation: req.Incarnation, RaftAddr: req.RaftAddr}}}
}

// StoreHeartbeat decides a store heartbeat (memory only: a down store that
// heartbeats again is marked up by the scheduler's next decision): ok (the
// shell records the report) when v has the store with hb's incarnation,
// else the store must register again.
func StoreHeartbeat(v *projections.State, hb client.StoreHeartbeat) (rep client.Reply, ok bool) {
	if st, found := v.Stores[hb.Store]; !found || st.Incarnation != hb.Incarnation {
		return client.Reply{Error: &client.RPCError{Code: client.CodeReregister, Message: fmt.Sprintf("store %s incarnation %s is not registered", hb.Store, hb.Incarnation)}}, false
	}
	return client.Reply{}, true
}

// StoreDrain decides a store.drain request at now: draining until now+for
// (never marked down meanwhile), or up again when for is 0. An unknown
// store is a bad request.
func StoreDrain(v *projections.State, req client.DrainRequest, now time.Time) Decision {
	if _, found := v.Stores[req.Store]; !found {
		return Decision{Reply: BadRequest(fmt.Errorf("unknown store %q", req.Store))}
	}
	if req.ForMS == 0 {
		return Decision{Events: []events.Payload{events.StoreState{Store: req.Store, State: events.StoreUp}}}
	}
	until := now.Add(time.Duration(req.ForMS) * time.Millisecond).UTC()
	return Decision{Events: []events.Payload{events.StoreState{Store: req.Store, State: events.StoreDraining, Until: until}}}
}

// StoreSelfDrain decides a store.selfdrain request at now (the store's
// process stops for a planned restart: the event says so): only the store's
// registered incarnation may drain it (with one key for every store, the
// NATS server cannot tell stores apart; the incarnation, random per process
// start, is what this store alone knows with its id in the stream).
func StoreSelfDrain(v *projections.State, req client.SelfDrainRequest, now time.Time) Decision {
	if st, found := v.Stores[req.Store]; !found || st.Incarnation != req.Incarnation {
		return Decision{Reply: client.Reply{Error: &client.RPCError{Code: client.CodeForbidden,
			Message: fmt.Sprintf("store %s incarnation %s is not registered", req.Store, req.Incarnation)}}}
	}
	until := now.Add(time.Duration(req.ForMS) * time.Millisecond).UTC()
	// Stopping: the process says it is going, so nothing it reported
	// counts from this event on (status names the planned stop at once).
	return Decision{Events: []events.Payload{events.StoreState{Store: req.Store, State: events.StoreDraining, Until: until, Stopping: true}}}
}

// Liveness is a leader term's memory of worker liveness: heartbeat
// deadlines by worker id (in memory only: a new leader grants fresh
// timeouts) and the reconnect count of the connection when they were last
// valid. It changes only through its methods, which apply the decisions
// above (Hear, Heartbeat, Expire); the shell gathers their inputs (the
// view, the connection, now) and keeps the Liveness on one goroutine.
type Liveness struct {
	Deadlines  map[uint64]Deadline
	Reconnects uint64
}

// NewLiveness is a new term's memory: no deadlines, the connection's
// reconnect count as it is now.
func NewLiveness(c Conn) *Liveness {
	return &Liveness{Deadlines: map[uint64]Deadline{}, Reconnects: c.Reconnects}
}

// Hear decides whether heartbeats reach the leader over c at now and, when
// the connection came back, pushes every deadline to the floor the decision
// names and remembers the reconnect count.
func (lv *Liveness) Hear(c Conn, now time.Time, cfg Config) Hearing {
	h := Hear(c, lv.Reconnects, now, cfg)
	if h.Back {
		lv.Reconnects = h.Reconnects
		for id, d := range lv.Deadlines {
			if d.At.Before(h.Floor) {
				d.At = h.Floor
				lv.Deadlines[id] = d
			}
		}
	}
	return h
}

// Renew grants registration (id, epoch) a fresh full timeout from now.
func (lv *Liveness) Renew(id, epoch uint64, now time.Time, cfg Config) {
	lv.Deadlines[id] = Renewed(epoch, now, cfg)
}

// Beat decides and applies a heartbeat of ref at now: hearing first (a
// deadline that passed during an outage is fresh again), then Heartbeat on
// the projected worker w (found: whether the view has ref.ID).
func (lv *Liveness) Beat(w projections.Worker, found bool, ref client.WorkerRef, c Conn, now time.Time, cfg Config) (rep client.Reply, h Hearing) {
	h = lv.Hear(c, now, cfg)
	d, has := lv.Deadlines[ref.ID]
	rep, renew := Heartbeat(w, found, ref, d, has, now)
	if renew {
		lv.Renew(ref.ID, ref.Epoch, now, cfg)
	}
	return rep, h
}

// Expire decides an expiry tick on v at now (Hear, then Expire), applies
// the deadlines it grants and drops, and returns the decision: nothing
// while heartbeats cannot arrive.
func (lv *Liveness) Expire(v *projections.State, c Conn, now time.Time, cfg Config) (Expiry, Hearing) {
	h := lv.Hear(c, now, cfg)
	if !h.Hearing {
		return Expiry{}, h
	}
	x := Expire(v, lv.Deadlines, now, cfg)
	for _, g := range x.Grant {
		lv.Deadlines[g.ID] = g.Deadline
	}
	for _, id := range x.Drop {
		delete(lv.Deadlines, id)
	}
	return x, h
}
