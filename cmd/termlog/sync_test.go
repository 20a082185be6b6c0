package main

import (
	"strings"
	"testing"

	"github.com/termlog/termlog/events/natslog"
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
	for _, p := range []natslog.SyncPolicy{natslog.SyncAlways, natslog.SyncInterval} {
		e, err := startEmbeddedNATS(t.TempDir(), 0, 1, p, secured{})
		if err != nil {
			t.Fatal(err)
		}
		js := e.srvs[0].NATS().JetStreamConfig()
		e.Shutdown()
		if js == nil || js.SyncAlways != (p == natslog.SyncAlways) {
			t.Errorf("sync %s: JetStream config %+v", p, js)
		}
	}
}
