package meta

import (
	"time"

	"github.com/nats-io/nats.go"
)

// leaveDrain bounds how long a replica whose NATS server goes into
// lame-duck mode sends no new append before it moves to another server:
// the appends in flight (milliseconds on a healthy cluster) get their acks
// on the old connection instead of losing them with it and waiting out an
// attempt. It is below the server's grace before it closes clients itself
// (natsserver.DefaultLameDuck/10 = 400ms).
const leaveDrain = 300 * time.Millisecond

// leavePoll is how often a leaving replica looks whether its appends in
// flight are settled.
const leavePoll = 5 * time.Millisecond

// ServerLeaving is a replica's NATS connection's LameDuckModeHandler: the
// server is stopping gracefully (its Raft leaderships were handed over).
// New appends are refused as while disconnected (ErrDisconnected: clients
// ask again); once the appends in flight are settled, or leaveDrain has
// passed, the connection moves to another server (ForceReconnect). Before,
// it waited the whole leaveDrain, every append refused for 300 ms of every
// graceful stop. It runs on nats.go's callback goroutine and returns once
// the move has begun.
func (r *Replica) ServerLeaving(nc *nats.Conn) {
	r.leaving.Store(true)
	r.log.Info().Str("server", nc.ConnectedServerName()).Dur("drain", leaveDrain).Msg("NATS server entering lame-duck mode: no new appends, then moving to another server")
	deadline := r.cfg.Clock.After(leaveDrain)
drain:
	for n := r.appendsInFlight(); n > 0; n = r.appendsInFlight() {
		select {
		case <-deadline:
			r.log.Info().Int("groups", n).Msg("lame-duck drain over with appends in flight: they are sent again after the move")
			break drain
		case <-r.cfg.Clock.After(leavePoll):
		}
	}
	_ = nc.ForceReconnect() // from here IsConnected is false until the move is done
	r.leaving.Store(false)
}

// appendsInFlight is how many groups the leader's committer has sent and
// not settled (0 when following), read on the term's loop.
func (r *Replica) appendsInFlight() int {
	r.mu.Lock()
	l := r.leader
	r.mu.Unlock()
	if l == nil {
		return 0
	}
	n := 0
	l.loop.read(func() { n = len(l.commit.flights) })
	return n
}
