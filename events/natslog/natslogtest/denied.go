// Package natslogtest holds NATS setups for the tests of natslog's
// readers and of what uses them.
package natslogtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
)

// StreamDenyingConsumerCreates starts a JetStream server on 127.0.0.1,
// creates cluster's event stream with n events in it, and returns a
// connection whose user may do anything but create a consumer. The server
// drops each of its creates unanswered (a permissions violation, said to
// the client only asynchronously), which is how a create looks from a
// reader while the JetStream meta leader is lost.
func StreamDenyingConsumerCreates(t testing.TB, cluster string, n int) (reader *nats.Conn) {
	t.Helper()
	deny := &server.Permissions{Publish: &server.SubjectPermission{Deny: []string{"$JS.API.CONSUMER.CREATE.>"}}}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "writer", Password: "w"}, {Username: "reader", Password: "r", Permissions: deny}}}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("StreamDenyingConsumerCreates: the server is not ready after 10s")
	}
	dial := func(opts ...nats.Option) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), append(opts, nats.Timeout(10*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := natslog.Open(ctx, dial(nats.UserInfo("writer", "w")), natslog.Config{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for i := 0; i < n; i += 100 {
		var evs []events.Event
		for j := i; j < min(n, i+100); j++ {
			evs = append(evs, events.Event{Term: 1, Writer: "meta-1", At: at,
				Data: events.WorkerRegistered{ID: uint64(j + 1), Endpoint: "127.0.0.1:5688", Kind: "compute", Parallelism: 4}})
		}
		if _, err := w.Append(ctx, uint64(i), evs...); err != nil {
			t.Fatal(err)
		}
	}
	return dial(nats.UserInfo("reader", "r"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the refused creates
}
