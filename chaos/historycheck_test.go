package chaos

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// realOps is a history recorded by the suite (r3, seed 9: the meta leader
// paused, a worker killed, a NATS node killed; probe requests answered by
// nobody while no leader served, some without a reply).
func realOps(t *testing.T) []Op {
	t.Helper()
	f, err := os.Open("testdata/ops.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ops []Op
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var op Op
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if len(ops) < 50 {
		t.Fatalf("%d ops", len(ops))
	}
	return ops
}

func TestHistoryChecker(t *testing.T) {
	check := HistoryChecker(3 * time.Second)
	ops := realOps(t)
	clean := t.TempDir()
	wantClean(t, "the recorded history", check(ops, clean))
	if _, err := os.Stat(filepath.Join(clean, "history")); !os.IsNotExist(err) {
		t.Errorf("a clean history left its visualisation: %v", err)
	}

	lastRead := -1
	firstReg := -1
	for i, op := range ops {
		if op.Kind == OpStatus && op.Outcome == OutcomeOK && len(op.Workers) >= 2 {
			lastRead = i
		}
		if op.Kind == OpRegister && op.Outcome == OutcomeOK && firstReg < 0 {
			firstReg = i
		}
	}
	if lastRead < 0 || firstReg < 0 {
		t.Fatal("testdata has no read with two workers or no acknowledged registration")
	}

	// A read that goes back in seq.
	back := append([]Op(nil), ops...)
	back[lastRead].Seq = 3
	dir := t.TempDir()
	wantViolation(t, "a read going back", check(back, dir), CheckHistory, "went back")
	if _, err := os.Stat(filepath.Join(dir, "history", "history.html")); err != nil {
		t.Errorf("no visualisation saved: %v", err)
	}

	// A read showing two active ids at one endpoint.
	two := append([]Op(nil), ops...)
	ws := append([]StatusWorker(nil), two[lastRead].Workers...)
	ws[1].Endpoint = ws[0].Endpoint
	two[lastRead].Workers = ws
	wantViolation(t, "two ids at an endpoint", check(two, t.TempDir()), CheckHistory, "two active ids at endpoint")

	// An acknowledged registration missing from a read while it
	// heartbeats.
	missing := append([]Op(nil), ops...)
	reg := ops[firstReg]
	ws = nil
	for _, w := range missing[lastRead].Workers {
		if w.ID != reg.ReplyID {
			ws = append(ws, w)
		}
	}
	if len(ws) == len(missing[lastRead].Workers) {
		t.Fatalf("the last read does not show worker %d", reg.ReplyID)
	}
	missing[lastRead].Workers = ws
	wantViolation(t, "a registration vanishing", check(missing, t.TempDir()), CheckHistory, "is missing, only")

	// An id granted twice, to two incarnations.
	reuse := append([]Op(nil), ops...)
	var other int = -1
	for i := firstReg + 1; i < len(reuse); i++ {
		if reuse[i].Kind == OpRegister && reuse[i].Outcome == OutcomeOK {
			other = i
			break
		}
	}
	if other < 0 {
		// The recorded history has one acknowledged registration only:
		// append a second one at another endpoint granting the same id.
		op := reg
		op.Client, op.Endpoint, op.Incarnation = "probe-9", "127.0.0.1:1", "forged"
		op.Invoke, op.Return = ops[len(ops)-1].Return.Add(time.Millisecond), ops[len(ops)-1].Return.Add(2*time.Millisecond)
		reuse = append(reuse, op)
	} else {
		reuse[other].ReplyID = reg.ReplyID
	}
	wantViolation(t, "an id reused", check(reuse, t.TempDir()), CheckHistory, "reused")
}
