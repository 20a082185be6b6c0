package logstore

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Dragonboat's loggers are process-global: silence them once, here.
	// LOGSTORE_DRAGONBOAT_LOG=info (or debug) shows them when debugging.
	level := "error"
	if l := os.Getenv("LOGSTORE_DRAGONBOAT_LOG"); l != "" {
		level = l
	}
	if err := SetDragonboatLogLevel(level); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// testLogger writes to the test log only when -v is on.
func testLogger(t *testing.T) zerolog.Logger {
	t.Helper()
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

var (
	portsMu sync.Mutex
	used    = map[string]bool{}
)

// freeAddr returns a loopback address with a port that was free a moment
// ago and that this process has not handed out before.
func freeAddr(t *testing.T) string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if !used[addr] {
			used[addr] = true
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

// testConfig is a fast Raft config for tests.
func testConfig(t *testing.T, store, dir, addr string) Config {
	return Config{
		StoreID:        store,
		DataDir:        dir,
		RaftAddr:       addr,
		RTTMillisecond: 20,
		ElectionRTT:    10,
		HeartbeatRTT:   1,
		// Small snapshots so that joiners and restarts go through
		// SaveSnapshot/RecoverFromSnapshot.
		SnapshotEntries:    8,
		CompactionOverhead: 2,
		LogDB:              LogDBTiny,
		Logger:             testLogger(t),
	}
}

func openHost(t *testing.T, cfg Config) *Host {
	t.Helper()
	h, err := Open(cfg)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.StoreID, err)
	}
	return h
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestMainSilencedLoggers(t *testing.T) {
	if err := SetDragonboatLogLevel("bogus"); err == nil {
		t.Fatal("want an error for an unknown level")
	}
}
