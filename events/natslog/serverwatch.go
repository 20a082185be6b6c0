package natslog

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/clock"
)

// A NATS node cut from its peers keeps its clients: their connections are
// up and answer pings, but JetStream does not answer through that node
// (requests time out, or come back 503 once it knows it has no meta
// leader). nats.go reconnects only when the connection breaks, so a meta
// whose server was cut off never took the lease again while the partition
// lasted, although two healthy nodes served JetStream (the chaos suite's
// "NATS node cut from its peers" scenario, with every meta connected to
// the cut node: no lease holder for the whole minute). WatchServer moves
// such a connection to another server.

// ServerWatch says how a connection's server is watched: a probe every
// Every, each bounded by Every; the connection moves to
// another server once none has been answered for After, and waits at
// least After before it moves again.
type ServerWatch struct {
	Every, After time.Duration
}

// DefaultServerWatch probes every 2 s and moves after 10 s without an
// answer: longer than a JetStream election (4–9 s), so an election alone
// moves no one.
var DefaultServerWatch = ServerWatch{Every: 2 * time.Second, After: 10 * time.Second}

// ShouldMove is the decision: the connection is up, another server is
// known, and JetStream has answered nothing through this one for w.After
// (since the last answer, or the last move).
func (w ServerWatch) ShouldMove(lastAnswer, now time.Time, connected bool, servers int) bool {
	return connected && servers > 1 && now.Sub(lastAnswer) >= w.After
}

// AccountInfoProbe asks JetStream for the account's info: only
// JetStream's meta leader answers it (503 from every node while it elects
// one, 4–9 s, hence After > 9 s). Not stream info: a member that sees its
// stream's group leaderless answers that from its own copy, so a node cut
// from its peers would keep answering the probe for as long as the cut
// lasts.
func AccountInfoProbe(nc *nats.Conn) (func(context.Context) error, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		return err
	}, nil
}

// WatchServer runs until ctx is done (its caller owns it and waits for
// it), calling probe every w.Every. Any answer counts, an API error too:
// only silence and "JetStream not available" (503) mean the server is cut
// off.
func WatchServer(ctx context.Context, nc *nats.Conn, w ServerWatch, probe func(context.Context) error, clk clock.Clock, lg zerolog.Logger) {
	last := clk.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(w.Every):
		}
		if !nc.IsConnected() {
			last = clk.Now() // reconnecting already; count from when it is back
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, w.Every)
		err := probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if answered(err) {
			last = clk.Now()
			continue
		}
		now := clk.Now()
		if !w.ShouldMove(last, now, nc.IsConnected(), len(nc.Servers())) {
			continue
		}
		url := nc.ConnectedUrlRedacted()
		lg.Warn().Str("url", url).Dur("unanswered_for", now.Sub(last)).Err(err).
			Msg("no answer through this NATS server; moving to another")
		if err := nc.ForceReconnect(); err != nil {
			lg.Warn().Err(err).Msg("moving to another NATS server")
		}
		last = now
	}
}

// answered: the probe reached something that answered it. A probe the
// key may not send is not answered either: nats.go reports the violation
// to the connection's error handler, and the request times out. So every
// watched role's key must grant its probe (tests/TestPermServerWatchProbes).
func answered(err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code != 503 // 503: JetStream system temporarily unavailable
	}
	return false
}
