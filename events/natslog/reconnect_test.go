package natslog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// A request made while the connection reconnects, on a connection that
// buffers nothing through a reconnect (ReconnectBufSize(-1), as termlog's
// roles connect), is refused by nats.go at once with
// ErrReconnectBufExceeded, never sent. AskAgain asks it again until the
// connection is back: it was the cause of TestOpenDuringElection's
// "store-3: ... nats: outbound buffer limit exceeded" (census 4 of
// docs/testing.md), a role's open failing where it should wait.
func TestAskAgainThroughAReconnect(t *testing.T) {
	dir, port := t.TempDir(), testkit.FreePort(t)
	start := func() *natsserver.Server {
		srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: dir, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := start()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) error { _, err := js.AccountInfo(ctx); return err }); err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	testkit.Eventually(t, 10*time.Second, "the connection reconnecting", nc.IsReconnecting)
	// The fact the fix rests on: refused at once, not sent.
	if _, err := js.AccountInfo(ctx); !errors.Is(err, nats.ErrReconnectBufExceeded) {
		t.Fatalf("a request while reconnecting: %v, want nats.ErrReconnectBufExceeded", err)
	}
	if !natslog.Unanswered(nats.ErrReconnectBufExceeded) {
		t.Fatal("a request refused while reconnecting is not counted unanswered")
	}

	// AskAgain is under way (its first attempt refused) before the server
	// is back; it must wait for the reconnect, not return the refusal.
	tries := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) error {
			select {
			case tries <- struct{}{}:
			default:
			}
			_, err := js.AccountInfo(ctx)
			return err
		})
	}()
	<-tries
	select {
	case err := <-done:
		if err != nil && nc.IsReconnecting() {
			t.Fatalf("AskAgain while reconnecting returned %v, before the server was back", err)
		}
	default:
	}
	srv = start()
	defer srv.Shutdown()
	if err := <-done; err != nil {
		t.Fatalf("AskAgain through the reconnect: %v", err)
	}
}
