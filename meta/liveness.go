package meta

import (
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/projections"
)

// liveness is a leader term's memory of worker liveness (decide.Liveness)
// with the configuration and what the shell does when the connection came
// back (log it). It belongs to the term's loop (termLoop): every method
// runs on the loop's goroutine.
type liveness struct {
	cfg  decide.Config
	back func(workers int) // the connection came back: the deadlines were pushed
	mem  *decide.Liveness
}

func newLiveness(cfg decide.Config, c decide.Conn, back func(workers int)) *liveness {
	return &liveness{cfg: cfg, back: back, mem: decide.NewLiveness(c)}
}

func (lv *liveness) heard(h decide.Hearing) {
	if h.Back {
		lv.back(len(lv.mem.Deadlines))
	}
}

// renew grants registration (id, epoch) a fresh full timeout from now.
func (lv *liveness) renew(id, epoch uint64, now time.Time) { lv.mem.Renew(id, epoch, now, lv.cfg) }

// beat decides and applies a heartbeat of ref at now (decide.Liveness.Beat).
func (lv *liveness) beat(w projections.Worker, found bool, ref client.WorkerRef, c decide.Conn, now time.Time) client.Reply {
	rep, h := lv.mem.Beat(w, found, ref, c, now, lv.cfg)
	lv.heard(h)
	return rep
}

// expire decides an expiry tick on v at now (decide.Liveness.Expire) and
// returns the events to append: none while heartbeats cannot arrive.
func (lv *liveness) expire(v *projections.State, c decide.Conn, now time.Time) []events.Payload {
	x, h := lv.mem.Expire(v, c, now, lv.cfg)
	lv.heard(h)
	return x.Events
}
