package logstore

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/termlog/termlog/internal/testkit"
)

func TestValidateRaftAddr(t *testing.T) {
	for _, bad := range []string{"", ":0", ":7000", "127.0.0.1:0", "127.0.0.1", "0.0.0.0:7000", "[::]:7000", "127.0.0.1:x", "127.0.0.1:70000"} {
		if err := ValidateRaftAddr(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: want ErrInvalidConfig, got %v", bad, err)
		}
	}
	for _, good := range []string{"127.0.0.1:7000", "localhost:7000", "log-2.svc:7000"} {
		if err := ValidateRaftAddr(good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}

func TestOpenValidates(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]Config{
		"no store id":  {DataDir: dir, RaftAddr: "127.0.0.1:7000"},
		"no data dir":  {StoreID: "s1", RaftAddr: "127.0.0.1:7000"},
		"port zero":    {StoreID: "s1", DataDir: dir, RaftAddr: ":0"},
		"bad logdb":    {StoreID: "s1", DataDir: dir, RaftAddr: "127.0.0.1:7000", LogDB: "huge"},
		"bad election": {StoreID: "s1", DataDir: dir, RaftAddr: "127.0.0.1:7000", ElectionRTT: 2, HeartbeatRTT: 1},
		"tls no key":   {StoreID: "s1", DataDir: dir, RaftAddr: "127.0.0.1:7000", TLS: &TLSFiles{CAFile: "ca.pem", CertFile: "cert.pem"}},
	} {
		if _, err := Open(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: want ErrInvalidConfig, got %v", name, err)
		}
	}
}

// TestStoreIdentity: the data dir remembers its store id, address and LogDB
// profile; a mismatch on restart is a clear error and touches nothing.
func TestStoreIdentity(t *testing.T) {
	dir := t.TempDir()
	addr := testkit.FreeAddr(t)
	cfg := testConfig(t, "s1", dir, addr)
	cfg.LogDB = ""
	h := openHost(t, cfg)
	if h.LogDB() != LogDBTiny || h.StoreID() != "s1" || h.RaftAddr() != addr {
		t.Fatalf("host: %s %s %s", h.LogDB(), h.StoreID(), h.RaftAddr())
	}
	h.Close()
	b, err := os.ReadFile(filepath.Join(dir, storeFileName))
	if err != nil || !strings.Contains(string(b), `"store_id": "s1"`) {
		t.Fatalf("store file: %s %v", b, err)
	}

	other := cfg
	other.StoreID = "s2"
	if _, err := Open(other); !errors.Is(err, ErrStoreIDMismatch) || !strings.Contains(err.Error(), `"s1"`) {
		t.Fatalf("other store id: %v", err)
	}
	moved := cfg
	moved.RaftAddr = testkit.FreeAddr(t)
	if _, err := Open(moved); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("other address: %v", err)
	}
	big := cfg
	big.LogDB = LogDBDefault
	if _, err := Open(big); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("other LogDB: %v", err)
	}
	h = openHost(t, cfg)
	h.Close()
}

// TestTinyNodeHostFootprint measures one idle tiny NodeHost.
func TestTinyNodeHostFootprint(t *testing.T) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	h := openHost(t, testConfig(t, "s1", t.TempDir(), testkit.FreeAddr(t)))
	defer h.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	g := runtime.NumGoroutine() - g0
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("tiny NodeHost: %d goroutines, %.2f MiB heap in use", g, float64(heap)/(1<<20))
	if g > 60 {
		t.Errorf("tiny NodeHost runs %d goroutines", g)
	}
}
