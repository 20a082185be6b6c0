package logstore

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	dblogger "github.com/lni/dragonboat/v4/logger"
	"github.com/rs/zerolog"
)

// TestDragonboatLinesAreJSON: once routed, a dragonboat logger writes JSON
// lines through termlog's logger, honours its level, and a later call moves
// the lines. (Loggers TestMain already used keep dragonboat's writer: the
// factory binds a logger when it is first used, hence fresh names here.)
func TestDragonboatLinesAreJSON(t *testing.T) {
	var a, b bytes.Buffer
	LogDragonboatTo(zerolog.New(&a))
	l := dblogger.GetLogger("termlog-test-a")
	l.SetLevel(dblogger.WARNING)
	l.Infof("hidden %d", 1)
	l.Warningf("send batch failed, target %s", "127.0.0.1:1")
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(a.Bytes()), &line); err != nil {
		t.Fatalf("not one JSON line (%v): %q", err, a.String())
	}
	if line["level"] != "warn" || line["pkg"] != "termlog-test-a" || line["component"] != "dragonboat" || line["message"] != "send batch failed, target 127.0.0.1:1" {
		t.Fatalf("line: %v", line)
	}
	LogDragonboatTo(zerolog.New(&b))
	l.Errorf("moved")
	if !strings.Contains(b.String(), `"message":"moved"`) || strings.Contains(a.String(), "moved") {
		t.Fatalf("after the second call: a=%q b=%q", a.String(), b.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Panicf did not panic")
		}
		if !strings.Contains(b.String(), `"message":"boom"`) {
			t.Fatalf("Panicf not logged: %q", b.String())
		}
	}()
	dblogger.GetLogger("termlog-test-b").Panicf("boom")
}
