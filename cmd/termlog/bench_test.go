package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestBenchCommand runs `termlog bench` at tiny sizes and checks that the
// JSON report has every figure, each with a baseline and a ratio, and that
// the run leaves no goroutine behind.
func TestBenchCommand(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs last
	out := filepath.Join(t.TempDir(), "bench.json")
	// A bound against a hang, not a budget: the run takes about 15 s
	// (the figures, not their times, are what is checked).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"bench", "--json", "--out", out, "--workers", "5", "--events", "200", "--grouped-appends", "2000",
		"--heartbeat-for", "1s", "--lease", "1s", "--phase-timeout", "30s"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	start := time.Now()
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Logf("bench took %s", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(stderr.String(), "bench: done in") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("--out given, yet stdout has %q", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workers  int `json:"workers"`
		Events   int `json:"events"`
		Figures  []map[string]any
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, b)
	}
	if rep.Workers != 5 || rep.Events != 200 || len(rep.Problems) > 0 {
		t.Fatalf("report: workers %d events %d problems %q", rep.Workers, rep.Events, rep.Problems)
	}
	want := []string{
		"fold.apply", "fold.decode_apply", "replay.read", "replay.projector", "catchup.snapshot",
		"append.throughput", "append.single", "append.vs_sync", "append.p50", "append.p99",
		"sync.append_single", "sync.append_p50", "sync.append_grouped", "sync.append_grouped_vs_interval", "sync.register_burst", "sync.register_append_rate",
		"register.burst", "register.append_rate", "heartbeat.cpu", "heartbeat.p99",
		"failover.term_started", "failover.recovered", "failover.served", "memory.projection", "memory.leader",
	}
	got := map[string]map[string]any{}
	for _, f := range rep.Figures {
		name, _ := f["name"].(string)
		got[name] = f
	}
	for _, name := range want {
		f, ok := got[name]
		if !ok {
			t.Errorf("figure %s missing", name)
			continue
		}
		for _, k := range []string{"value", "baseline", "ratio"} {
			x, ok := f[k].(float64)
			if !ok || math.IsNaN(x) || x <= 0 {
				t.Errorf("%s: %s = %v, want a positive number", name, k, f[k])
			}
		}
		if s, _ := f["baseline_what"].(string); s == "" {
			t.Errorf("%s: baseline not described", name)
		}
		if tgt, ok := f["target"].(map[string]any); ok {
			if _, ok := f["met"].(bool); !ok || tgt["text"] == "" {
				t.Errorf("%s: target without a verdict: %v", name, f)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d figures, want %d: %v", len(got), len(want), got)
	}

	// --only runs just what it names, and the table goes to stdout.
	stdout.Reset()
	root = newRoot()
	root.SetArgs([]string{"bench", "--only", "fold", "--events", "200"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	table := stdout.String()
	if !strings.Contains(table, "fold.decode_apply") || strings.Contains(table, "replay.read") || !strings.Contains(table, "baseline") {
		t.Errorf("--only fold table:\n%s", table)
	}
	root = newRoot()
	root.SetArgs([]string{"bench", "--only", "nope"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	if err := root.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("--only nope: %v", err)
	}
}
