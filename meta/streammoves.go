package meta

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/wire"
)

// streamMoves tells the append attempts in flight that the event stream has
// a new Raft leader: JetStream's leader-elected advisory, on the replica's
// connection. An append whose request reached the old leader as it handed
// over (a graceful stop) or died (a crash) is not answered, and waited out
// its attempt (0.5 s) before it was sent again; each attempt now also ends
// when the stream's next leader is elected, and is sent again at once, with
// the same message ids and expected last seq (the log stores it once).
//
// The Replica owns it: its subscription lives from Run's start to its end;
// the channel is replaced, under mu, at each election.
type streamMoves struct {
	mu sync.Mutex
	ch chan struct{}
}

func newStreamMoves() *streamMoves { return &streamMoves{ch: make(chan struct{})} }

// current is closed at the next election of the stream's leader.
func (m *streamMoves) current() <-chan struct{} {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ch
}

// moved marks an election: every current channel closes.
func (m *streamMoves) moved() {
	m.mu.Lock()
	close(m.ch)
	m.ch = make(chan struct{})
	m.mu.Unlock()
}

// watch subscribes to the stream's leader-elected advisories on nc until
// stop is called (the subscription's callback runs on nats.go's goroutine).
func (m *streamMoves) watch(nc *nats.Conn, cluster string, lg zerolog.Logger) (stop func(), err error) {
	sub, err := nc.Subscribe(wire.StreamLeaderElected(cluster), func(msg *nats.Msg) {
		var adv struct {
			Leader string `json:"leader"`
		}
		_ = json.Unmarshal(msg.Data, &adv)
		lg.Info().Str("leader", adv.Leader).Msg("the event stream elected a leader: appends waiting for an answer are sent again now")
		m.moved()
	})
	if err != nil {
		return func() {}, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// attemptCtx bounds one append attempt by d, and ends it too once moved
// (streamMoves.current when the attempt was sent; nil: never) is closed.
// cancel must be called; it also ends the goroutine that watches.
func attemptCtx(parent context.Context, d time.Duration, moved <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	if moved == nil {
		return ctx, cancel
	}
	go func() {
		select {
		case <-moved:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
