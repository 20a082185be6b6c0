package natslog_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestWatchServerMovesOffASilentJetStream: connected to a server through
// which JetStream does not answer (here: one without JetStream; in the
// chaos suite, a node cut from its peers), a watched connection moves to
// the next server, where JetStream answers. Deleting the move (ShouldMove
// always false) turns it red.
func TestWatchServerMovesOffASilentJetStream(t *testing.T) {
	t.Parallel()
	silent, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go silent.Start()
	defer silent.Shutdown()
	if !silent.ReadyForConnections(5 * time.Second) {
		t.Fatal("silent server not ready")
	}
	js, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer js.Shutdown()
	nc, err := nats.Connect(silent.ClientURL()+","+js.ClientURL(), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.ConnectedUrl() != silent.ClientURL() {
		t.Fatalf("connected to %s first, want the silent server %s", nc.ConnectedUrl(), silent.ClientURL())
	}
	probe, err := natslog.AccountInfoProbe(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		natslog.WatchServer(ctx, nc, natslog.ServerWatch{Every: 50 * time.Millisecond, After: 300 * time.Millisecond}, probe, clock.Real{}, testkit.Logger(t))
	}()
	defer func() { cancel(); <-done }()
	testkit.Eventually(t, 10*time.Second, "the connection moves to the server with JetStream", func() bool {
		return nc.IsConnected() && nc.ConnectedUrl() == js.ClientURL()
	})
	jsc, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	if _, err := jsc.AccountInfo(actx); err != nil {
		t.Fatalf("JetStream after the move: %v", err)
	}
}
