package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// --sync on nats and up: default always, interval accepted, anything else
// refused when parsed, naming the choices.
func TestSyncFlag(t *testing.T) {
	root := newRoot()
	for _, name := range []string{"nats", "up"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags().Lookup("sync")
		if f == nil {
			t.Fatalf("%s has no --sync", name)
		}
		if f.DefValue != "always" {
			t.Errorf("%s --sync defaults to %q, want always", name, f.DefValue)
		}
		if err := cmd.Flags().Set("sync", "interval"); err != nil || f.Value.String() != "interval" {
			t.Errorf("%s --sync interval: %v (value %s)", name, err, f.Value)
		}
		for _, bad := range []string{"never", "", "1s"} {
			if err := cmd.Flags().Set("sync", bad); err == nil || !strings.Contains(err.Error(), "always") {
				t.Errorf("%s --sync %q: %v, want a refusal naming the choices", name, bad, err)
			}
		}
	}
}

// up's embedded server runs with the policy asked for.
func TestEmbeddedNATSSync(t *testing.T) {
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		e, err := startEmbeddedNATS(t.TempDir(), 0, 1, p, secured{})
		if err != nil {
			t.Fatal(err)
		}
		js := e.srvs[0].NATS().JetStreamConfig()
		e.Shutdown()
		if js == nil || js.SyncAlways != (p == natsserver.SyncAlways) {
			t.Errorf("sync %s: JetStream config %+v", p, js)
		}
	}
}

// up opens the stream with the admin key before its replicas start: a
// stream an older termlog made (deletes and purges allowed), which the meta
// role may not update, is protected, and then the meta role opens it.
func TestUpProtectsOldStream(t *testing.T) {
	data := t.TempDir()
	var ss serverSecurity
	sec, err := ss.setup(natslog.DefaultCluster, filepath.Join(data, "auth"), "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startEmbeddedNATS(data, 0, 1, natsserver.SyncAlways, sec)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	conn := func(r natsserver.Role) *nats.Conn {
		nc, err := srv.Connect(0, "test-"+string(r), r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(conn(natsserver.RoleAdmin))
	if err != nil {
		t.Fatal(err)
	}
	old := natslog.StreamConfig(natslog.Config{})
	old.DenyDelete, old.DenyPurge = false, false
	st, err := js.CreateStream(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natslog.Open(ctx, conn(natsserver.RoleMeta), natslog.Config{RequestTimeout: time.Second}); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("the meta role opened an unprotected stream: %v", err)
	}
	if err := upOpenStream(ctx, srv, natslog.DefaultCluster, 1); err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || !info.Config.DenyDelete || !info.Config.DenyPurge {
		t.Fatalf("after up's open: %+v, %v", info, err)
	}
	if _, err := natslog.Open(ctx, conn(natsserver.RoleMeta), natslog.Config{}); err != nil {
		t.Fatalf("meta after up protected the stream: %v", err)
	}
}
