package logstore

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/internal/testkit"
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
		Logger:             testkit.Logger(t),
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
