package natsserver_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/natsserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServerClusterConfigErrors(t *testing.T) {
	t.Parallel()
	route := natsserver.RouteURL(6222)
	for _, tc := range []struct {
		name string
		cfg  natsserver.ServerConfig
		want string
	}{
		{"no name", natsserver.ServerConfig{ClusterName: "c", Routes: []string{route}}, "Name"},
		{"no routes", natsserver.ServerConfig{ClusterName: "c", Name: "n1"}, "Routes"},
		{"dont listen", natsserver.ServerConfig{ClusterName: "c", Name: "n1", Routes: []string{route}, DontListen: true}, "DontListen"},
		{"routes without cluster", natsserver.ServerConfig{Routes: []string{route}}, "ClusterName"},
		{"port without cluster", natsserver.ServerConfig{ClusterPort: 6222}, "ClusterName"},
		{"remote route", natsserver.ServerConfig{ClusterName: "c", Name: "n1", Routes: []string{"nats-route://10.0.0.1:6222"}}, "127.0.0.1"},
		{"route without port", natsserver.ServerConfig{ClusterName: "c", Name: "n1", Routes: []string{"nats-route://127.0.0.1"}}, "port"},
		{"route scheme", natsserver.ServerConfig{ClusterName: "c", Name: "n1", Routes: []string{"http://127.0.0.1:6222"}}, "scheme"},
	} {
		tc.cfg.DataDir = t.TempDir()
		s, err := natsserver.StartServer(tc.cfg)
		if err == nil {
			s.Shutdown()
			t.Errorf("%s: started", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

// The embedded server syncs every write before it acknowledges it unless
// asked for nats-server's interval sync: the zero ServerConfig is durable.
func TestServerSyncPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy     natsserver.SyncPolicy
		syncAlways bool
	}{
		{natsserver.SyncAlways, true},
		{natsserver.SyncInterval, false},
	} {
		s, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), DontListen: true, Sync: tc.policy})
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.NATS().JetStreamConfig()
		s.Shutdown()
		if cfg == nil || cfg.SyncAlways != tc.syncAlways || cfg.SyncInterval != natsserver.DefaultSyncInterval {
			t.Errorf("sync %s: JetStream config %+v, want sync_always %v, sync interval %s", tc.policy, cfg, tc.syncAlways, natsserver.DefaultSyncInterval)
		}
		if s.Sync() != tc.policy {
			t.Errorf("Sync() = %s, want %s", s.Sync(), tc.policy)
		}
	}
	// The zero value of ServerConfig is SyncAlways.
	if got := (natsserver.ServerConfig{}).Sync; got != natsserver.SyncAlways {
		t.Errorf("zero ServerConfig syncs %s", got)
	}
	if _, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Sync: 7}); err == nil || !strings.Contains(err.Error(), "sync policy") {
		t.Errorf("unknown sync policy: %v", err)
	}
}

func TestParseSyncPolicy(t *testing.T) {
	t.Parallel()
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		if got, err := natsserver.ParseSyncPolicy(p.String()); err != nil || got != p {
			t.Errorf("ParseSyncPolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	for _, bad := range []string{"", "Always", "never", "2m"} {
		if _, err := natsserver.ParseSyncPolicy(bad); err == nil || !strings.Contains(err.Error(), "always") {
			t.Errorf("ParseSyncPolicy(%q): %v, want an error naming the choices", bad, err)
		}
	}
}

// TestServerLogFunc: with Log set, every entry reaches it with its level
// (the server says it is ready at INF), none is dropped on the way.
func TestServerLogFunc(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	s, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), DontListen: true, Log: func(level, msg string) {
		mu.Lock()
		got = append(got, level+" "+msg)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, "INF ") && strings.Contains(l, "Server is ready") }) {
		t.Fatalf("no INF 'Server is ready' entry in %d entries: %q", len(got), got)
	}
}
