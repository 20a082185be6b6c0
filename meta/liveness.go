package meta

import (
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/projections"
)

// liveness is a leader term's memory of worker liveness: heartbeat
// deadlines by worker id, in memory only (a new leader grants fresh
// timeouts), and the reconnect count of the connection when they were last
// valid. It belongs to the term's loop (termLoop): every method runs on the
// loop's goroutine, and the state changes only as the pure decisions say
// (decide.Hear, decide.Heartbeat, decide.Expire). Its callers gather the
// other inputs (the view, the connection, now).
type liveness struct {
	cfg  decide.Config
	back func(workers int) // called when the connection came back: the deadlines were pushed

	deadlines  map[uint64]decide.Deadline
	reconnects uint64
}

func newLiveness(cfg decide.Config, c decide.Conn, back func(workers int)) *liveness {
	return &liveness{cfg: cfg, back: back, deadlines: map[uint64]decide.Deadline{}, reconnects: c.Reconnects}
}

// hear decides whether heartbeats can reach the leader over c at now and,
// when the connection came back, pushes every deadline to the floor the
// decision names.
func (lv *liveness) hear(c decide.Conn, now time.Time) bool {
	h := decide.Hear(c, lv.reconnects, now, lv.cfg)
	if h.Back {
		lv.reconnects = h.Reconnects
		for id, d := range lv.deadlines {
			if d.At.Before(h.Floor) {
				d.At = h.Floor
				lv.deadlines[id] = d
			}
		}
		lv.back(len(lv.deadlines))
	}
	return h.Hearing
}

// renew grants registration (id, epoch) a fresh full timeout from now.
func (lv *liveness) renew(id, epoch uint64, now time.Time) {
	lv.deadlines[id] = decide.Renewed(epoch, now, lv.cfg)
}

// beat decides and applies a heartbeat of ref at now (decide.Heartbeat:
// ownership first, then the deadline); w and found are the projected
// worker ref.ID. forbidden: ref names a registration it does not own.
func (lv *liveness) beat(w projections.Worker, found bool, ref client.WorkerRef, c decide.Conn, now time.Time) (rep client.Reply, forbidden bool) {
	lv.hear(c, now) // a deadline that passed during an outage is fresh again
	d, has := lv.deadlines[ref.ID]
	rep, renew, forbidden := decide.Heartbeat(w, found, ref, d, has, now)
	if renew {
		lv.deadlines[ref.ID] = decide.Renewed(ref.Epoch, now, lv.cfg)
	}
	return rep, forbidden
}

// expire decides an expiry tick on v at now (decide.Hear, decide.Expire),
// applies the deadlines it grants and drops, and returns the events to
// append: none while heartbeats cannot arrive.
func (lv *liveness) expire(v *projections.State, c decide.Conn, now time.Time) []events.Payload {
	if !lv.hear(c, now) {
		return nil
	}
	x := decide.Expire(v, lv.deadlines, now, lv.cfg)
	for _, g := range x.Grant {
		lv.deadlines[g.ID] = g.Deadline
	}
	for _, id := range x.Drop {
		delete(lv.deadlines, id)
	}
	return x.Events
}
