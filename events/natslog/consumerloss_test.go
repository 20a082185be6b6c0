package natslog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// TestWatchConsumerServerLost: the server holding a Watch's consumer shuts
// down (an R3 stream keeps its events on the other two). The Watch makes a
// new consumer and delivers the next event, without an error. How long the
// event waited in the stream before the Watch delivered it is logged, with
// whether the reader's own connection was to the lost server: a
// measurement (see the README), not an assertion.
func TestWatchConsumerServerLost(t *testing.T) {
	t.Parallel()
	srvs, urls := start3(t, natsserver.ServerConfig{})
	dial := func(name string) *nats.Conn {
		return connectAll(t, urls, nats.Name(name), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	}
	rnc, wnc := dial("reader"), dial("writer")
	reader := open(t, rnc, natslog.Config{Replicas: 3})
	writer := open(t, wnc, natslog.Config{Replicas: 3})
	if _, err := writer.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	type delivered struct {
		seq uint64
		at  time.Time
	}
	got := make(chan delivered)
	done := make(chan error, 1)
	go func() {
		done <- reader.Watch(ctx, 1, func(r events.Record) error {
			select {
			case got <- delivered{r.Seq, time.Now()}:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after cancel", err)
		}
	})
	recv := func(want uint64) delivered {
		t.Helper()
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		select {
		case d := <-got:
			if d.seq != want {
				t.Fatalf("Watch delivered seq %d, want %d", d.seq, want)
			}
			return d
		case err := <-done:
			done <- err
			t.Fatalf("Watch returned %v", err)
		case <-timer.C:
			t.Fatalf("Watch did not deliver seq %d", want)
		}
		return delivered{}
	}
	recv(1)
	host := consumerServer(t, wnc, reader.Stream())
	victim := -1
	for i, s := range srvs {
		if s.Name() == host {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("the consumer is on %q, not a node of the cluster", host)
	}
	own := rnc.ConnectedServerName() == host
	metaLeader := srvs[victim].MetaLeader() == host
	srvs[victim].Shutdown()
	down := time.Now()
	// The stream may be electing a leader.
	appendRetrying(t, writer, 1, ev(1, 1), 30*time.Second)
	acked := time.Now()
	d := recv(2)
	t.Logf("consumer server %s down (reader connected to it: %v, meta leader: %v): append acked after %s, delivered %s after the ack",
		host, own, metaLeader, acked.Sub(down).Round(time.Millisecond), max(0, d.at.Sub(acked)).Round(time.Millisecond))
}

// consumerServer waits for the one consumer of stream and returns the name
// of the server it lives on.
func consumerServer(t *testing.T, nc *nats.Conn, stream string) string {
	t.Helper()
	cis := waitConsumers(t, nc, stream, "it has a single consumer with a leader", func(cis []*jetstream.ConsumerInfo) bool {
		return len(cis) == 1 && cis[0].Cluster != nil && cis[0].Cluster.Leader != ""
	})
	return cis[0].Cluster.Leader
}
