package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/chaos/history"
	"github.com/termlog/termlog/meta/client"
)

// The chaos runs check their recorded client operations with
// chaos/history: HistoryChecker and ToHistory (historycheck.go). The
// partition scenarios use them through these two names.

// checkOpHistory checks the runner's operations against the worker
// registry's model; the visualisation goes to dir/history on a violation.
func checkOpHistory(ops []Op, dir string) []Violation {
	return HistoryChecker(DefaultConfig("", "", Standalone).WorkerTimeout)(ops, dir)
}

// toHistory is ToHistory.
func toHistory(ops []Op) []history.Op { return ToHistory(ops) }

func TestHistoryWiring(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	good := []Op{
		{Client: "probe-1", Kind: OpRegister, Endpoint: "127.0.0.1:1", Incarnation: "i1", Invoke: ms(0), Return: ms(10), Outcome: OutcomeOK, ReplyID: 1, ReplyEpoch: 3},
		{Client: "probe-1", Kind: OpHeartbeat, ID: 1, Epoch: 3, Invoke: ms(20), Return: ms(30), Outcome: OutcomeOK},
		{Client: "status", Kind: OpStatus, Invoke: ms(40), Return: ms(50), Outcome: OutcomeOK, Seq: 4,
			Workers: []StatusWorker{{ID: 1, Epoch: 3, Incarnation: "i1", Endpoint: "127.0.0.1:1", State: "running"}}},
		{Client: "probe-1", Kind: OpDeregister, ID: 1, Epoch: 3, Invoke: ms(60), Return: ms(70), Outcome: client.CodeUnavailable},
		{Client: "status", Kind: OpStatus, Invoke: ms(80), Return: ms(90), Outcome: OutcomeOK, Seq: 5},
	}
	if v := checkOpHistory(good, t.TempDir()); len(v) != 0 {
		t.Fatalf("want no violation, got %v", v)
	}
	// The same with the deregistration refused (forbidden: it changed
	// nothing): the registration may not vanish 80 ms after a heartbeat.
	bad := append([]Op(nil), good...)
	bad[3].Outcome = client.CodeForbidden
	v := checkOpHistory(bad, t.TempDir())
	if len(v) != 1 || v[0].Check != CheckHistory || !strings.Contains(v[0].Detail, "missing") {
		t.Fatalf("want a history violation naming the missing registration, got %v", v)
	}
}
