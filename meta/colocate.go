package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/internal/wire"
)

// colocateEvery is how often a leader checks that the lease bucket's Raft
// leader is on the event stream leader's NATS node; colocateCooldown is how
// long it waits after asking for a move.
const (
	colocateEvery    = time.Second
	colocateCooldown = 5 * time.Second
)

// colocateDuty keeps the lease's Raft leader beside the event stream's
// (colocateLoop).
type colocateDuty struct {
	cfg    *Config
	logger zerolog.Logger
}

// colocateLoop keeps the lease bucket's Raft leader on the NATS node that
// leads the event stream, while the term lasts. On a replicated cluster
// the two are separate Raft groups: apart, losing either leader's node
// costs an election (4-9 s), and losing the lease's alone ends the term
// while appends could go on; together, one node's loss is one outage, and
// the other two nodes' losses cost nothing. It asks the lease bucket's
// leader to step down in favour of the event stream's leader (a planned
// handover: a renewal meanwhile is asked again, see renew); the stream's
// own leader is never moved, so appends never pause for it.
func (cd *colocateDuty) colocateLoop(ctx context.Context) {
	nc := cd.cfg.NC
	if nc == nil {
		return
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	events, lease := wire.Stream(cd.cfg.Cluster), "KV_"+wire.LeaseBucket(cd.cfg.Cluster)
	single := false // the stream has one replica: nothing to keep together
	leaderOf := func(name string) (string, bool) {
		actx, cancel := context.WithTimeout(ctx, colocateEvery)
		defer cancel()
		st, err := js.Stream(actx, name)
		if err != nil {
			return "", false
		}
		if st.CachedInfo().Config.Replicas <= 1 {
			single = true
			return "", false
		}
		ci := st.CachedInfo().Cluster
		if ci == nil {
			return "", false
		}
		return ci.Leader, ci.Leader != ""
	}
	wait := colocateEvery
	for {
		select {
		case <-ctx.Done():
			return
		case <-cd.cfg.Clock.After(wait):
		}
		wait = colocateEvery
		evL, ok1 := leaderOf(events)
		if single {
			return
		}
		leL, ok2 := leaderOf(lease)
		if !ok1 || !ok2 || evL == leL {
			continue
		}
		req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": evL}})
		_, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+lease, req)
		ev := cd.logger.Info()
		if err != nil {
			ev = cd.logger.Warn().Err(err)
		}
		ev.Str("stream_leader", evL).Str("lease_leader", leL).Msg(fmt.Sprintf("moving the lease bucket's Raft leader to %s, the event stream's (one node's loss, not either of two, can cost the leader an election)", evL))
		wait = colocateCooldown
	}
}
