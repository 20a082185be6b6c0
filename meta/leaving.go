package meta

import (
	"time"

	"github.com/nats-io/nats.go"
)

// leaveDrain is how long a replica whose NATS server goes into lame-duck
// mode sends no new append before it moves to another server: the appends
// in flight (milliseconds on a healthy cluster) get their acks on the old
// connection instead of losing them with it and waiting out AppendTimeout.
// It is below the server's grace before it closes clients itself
// (natsserver.DefaultLameDuck/10 = 400ms).
const leaveDrain = 300 * time.Millisecond

// ServerLeaving is a replica's NATS connection's LameDuckModeHandler: the
// server is stopping gracefully (its Raft leaderships were handed over).
// New appends are refused as while disconnected (ErrDisconnected: clients
// ask again), the appends in flight are given leaveDrain to be answered,
// then the connection moves to another server (ForceReconnect). It runs on
// nats.go's callback goroutine and returns once the move has begun.
func (r *Replica) ServerLeaving(nc *nats.Conn) {
	r.leaving.Store(true)
	r.log.Info().Str("server", nc.ConnectedServerName()).Dur("drain", leaveDrain).Msg("NATS server entering lame-duck mode: no new appends, then moving to another server")
	t := time.NewTimer(leaveDrain)
	<-t.C
	_ = nc.ForceReconnect() // from here IsConnected is false until the move is done
	r.leaving.Store(false)
}
