package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/termlog/termlog/internal/testkit"
)

// getJSON decodes a GET's JSON answer.
func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// scrape reads one metric family's samples from a /metrics endpoint,
// parsed with expfmt: {label value of key: value}.
func scrape(t *testing.T, addr, family, key string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%s", err, b)
	}
	out := map[string]float64{}
	f, ok := fams[family]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		out[label(m, key)] = value(m)
	}
	return out
}

func label(m *dto.Metric, key string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == key {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}

// statusJSON runs status -o json and returns its exit code and status.
func statusJSON(t *testing.T, bin string) (int, Status, string) {
	t.Helper()
	r := runEnv(t, bin, nil, "status", "-o", "json")
	var s Status
	if r.code != 2 {
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("status -o json: %v\n%s\n%s", err, r.stdout, r.stderr)
		}
	}
	return r.code, s, r.stderr
}

func shardHealth(s Status, shard uint64) (running int, leader string, ok bool) {
	if s.Health.Record == nil {
		return 0, "", false
	}
	for _, h := range s.Health.Record.Shards {
		if h.Shard == shard {
			if h.Leader != 0 {
				leader = fmt.Sprintf("%d@%s", h.Leader, h.LeaderStore)
			}
			return h.Live, leader, true
		}
	}
	return 0, "", false
}

// TestCLIShardHealthAndRollingRestart is issue 12's "done when", with the
// built binary as separate processes (nats, meta, three logstores):
//   - a frozen store (SIGSTOP) makes `status` say which shard runs 2/3,
//     name its leader and exit 1, within --store-timeout plus a few
//     seconds; /metrics shows the same numbers;
//   - a rolling restart of the three stores, one at a time (SIGTERM,
//     start, `status --wait-healthy`), replaces nothing: each store drains
//     itself on SIGTERM, however long it stays down;
//   - issue 20's gates: the README's loop with no pause between restart
//     and gate (`store stop --data`, start, `status --wait-healthy`): the
//     first status after a store's process is reaped exits 1 naming the
//     planned stop and the shard at 2/3; each gate passes only once the
//     restarted store's own /metrics runs its replica, the meta leader's
//     /metrics knows the shard's Raft leader, and nothing was replaced;
//     status right after `meta stepdown --wait` exits 0; `status --bogus`
//     exits 2.
func TestCLIShardHealthAndRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir, port := rolesEnv(t, bin)
	srv := startProc(t, bin, "nats", "--port", fmt.Sprint(port), "--data", filepath.Join(dir, "nats"))
	srv.waitFor(t, "NATS JetStream at")
	metaMetrics := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	web := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	m := startProc(t, bin, "meta", "run", "--id", "meta-1", "--shards", "1", "--store-timeout", "6s", "--metrics-addr", metaMetrics, "--web-addr", web)
	type store struct {
		id, addr, data, metrics string
		p                       *upProc
	}
	var stores []*store
	for i := 1; i <= 3; i++ {
		s := &store{id: fmt.Sprintf("store-%d", i), addr: fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)), data: filepath.Join(dir, fmt.Sprintf("store-%d", i)),
			metrics: fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))}
		stores = append(stores, s)
	}
	start := func(s *store) {
		s.p = startProc(t, bin, "logstore", "--id", s.id, "--raft-addr", s.addr, "--data", s.data, "--metrics-addr", s.metrics, "--restart-grace", "10m")
	}
	for _, s := range stores {
		start(s)
	}
	waitStatus := func(what string, within time.Duration, cond func(code int, s Status) bool) (int, Status) {
		t.Helper()
		var code int
		var s Status
		var stderr string
		if testkit.Poll(t.Context(), within, 200*time.Millisecond, func() error {
			if code, s, stderr = statusJSON(t, bin); !cond(code, s) {
				return errors.New("not yet")
			}
			return nil
		}) == nil {
			return code, s
		}
		rec, _ := json.MarshalIndent(s.Health, "", " ")
		logs := ""
		for _, st := range stores {
			logs += fmt.Sprintf("\n%s:\n%s", st.id, st.p.errOut.String())
		}
		t.Fatalf("timed out after %s waiting for %s: last status exit %d, problems %q, stderr %s\nhealth: %s\nmeta:\n%s%s", within, what, code, s.Health.Problems, stderr, rec, m.errOut.String(), logs)
		return 0, Status{}
	}
	waitStatus("a healthy cluster with shard 1 at 3/3", 60*time.Second, func(code int, s Status) bool {
		running, _, ok := shardHealth(s, 1)
		return code == 0 && ok && running == 3
	})
	if r := runEnv(t, bin, nil, "status", "--wait-healthy", "--timeout", "30s"); r.code != 0 {
		t.Fatalf("status --wait-healthy on a healthy cluster: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Freeze store-3: Raft at 2/3, store-3 silent.
	frozen := stores[2]
	if err := frozen.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	froze := time.Now()
	code, s := waitStatus("status to say shard 1 runs 2/3 and exit 1", 20*time.Second, func(code int, s Status) bool {
		running, leader, ok := shardHealth(s, 1)
		// Replica 3 still a member: the record says 2/3 before any
		// replacement, not because of one.
		return ok && code == 1 && running == 2 && len(s.Health.Record.Shards[0].Members) == 3 && leader != "" && !strings.HasSuffix(leader, "@store-3")
	})
	running, leader, _ := shardHealth(s, 1)
	// The console the meta replica serves (--web-addr) says the same: the
	// frozen store's replica is not running, and status's exit 1.
	testkit.Eventually(t, 10*time.Second, "the console shows store-3's replica not running", func() bool {
		var sh struct {
			Health []struct {
				Members map[string]string `json:"members"`
				Running []uint64          `json:"running_replicas"`
			} `json:"health"`
		}
		var st struct {
			Exit int `json:"exit"`
		}
		if getJSON("http://"+web+"/api/v1/shards", &sh) != nil || getJSON("http://"+web+"/api/v1/status?brief=1", &st) != nil || len(sh.Health) != 1 || st.Exit != 1 {
			return false
		}
		for r, store := range sh.Health[0].Members {
			if store == "store-3" {
				id, err := strconv.ParseUint(r, 10, 64)
				return err == nil && len(sh.Health[0].Running) == 2 && !slices.Contains(sh.Health[0].Running, id)
			}
		}
		return false
	})
	t.Logf("after %s frozen: status exit %d, shard 1 %d/3 leader %s, problems %q", time.Since(froze).Round(100*time.Millisecond), code, running, leader, s.Health.Problems)
	r := runEnv(t, bin, nil, "status")
	if r.code != 1 || !strings.Contains(r.stdout, "shard 1   2/3 running  leader "+leader) || !strings.Contains(r.stderr, "degraded") {
		t.Fatalf("status table: exit %d, want 1 and shard 1 at 2/3 with leader %s:\n%s\n%s", r.code, leader, r.stdout, r.stderr)
	}
	// /metrics says the same.
	if testkit.Poll(t.Context(), 10*time.Second, 100*time.Millisecond, func() error {
		if scrape(t, metaMetrics, "termlog_shard_replicas_running", "shard")["1"] != 2 {
			return errors.New("not 2")
		}
		return nil
	}) != nil {
		t.Fatalf("meta metrics: %v", scrape(t, metaMetrics, "termlog_shard_replicas_running", "shard"))
	}
	if got := scrape(t, metaMetrics, "termlog_shard_healthy", "shard")["1"]; got != 0 {
		t.Fatalf("termlog_shard_healthy{shard=1} = %v while frozen", got)
	}
	if err := frozen.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitStatus("healthy again after SIGCONT", 60*time.Second, func(code int, s Status) bool { return code == 0 })
	if got := scrape(t, frozen.metrics, "termlog_store_replicas_running", "store")["store-3"]; got != 1 {
		t.Fatalf("store-3 metrics: replicas running %v", got)
	}

	// The rolling restart: each store in turn, down for longer than the
	// store timeout, gated by --wait-healthy.
	for _, st := range stores {
		st.p.stop(t)
		waitStatus(st.id+" silent past the store timeout and still draining", 40*time.Second, func(code int, s Status) bool {
			for _, h := range s.Health.Record.Stores {
				if h.Store == st.id {
					return code == 1 && h.State == "draining" && !h.Live && time.Since(h.LastHeartbeat) > 7*time.Second
				}
			}
			return false
		})
		start(st)
		if r := runEnv(t, bin, nil, "status", "--wait-healthy", "--timeout", "60s"); r.code != 0 {
			t.Fatalf("after restarting %s: status --wait-healthy exit %d\n%s\n%s", st.id, r.code, r.stdout, r.stderr)
		}
	}
	r = runEnv(t, bin, nil, "replay", "--type", "operator.started")
	if strings.Contains(r.stdout, "operator.started") {
		t.Fatalf("the rolling restart started operators:\n%s", r.stdout)
	}

	// A second meta replica, for the stepdown below.
	meta2Metrics := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	m2 := startProc(t, bin, "meta", "run", "--id", "meta-2", "--shards", "1", "--store-timeout", "6s", "--metrics-addr", meta2Metrics)
	m2.waitIn(t, &m2.errOut, "meta replica starting")

	// The README's loop, with no pause between the restart and the gate:
	// `store stop --data` (SIGTERM, then it waits until the process has
	// exited), start it again at once, `status --wait-healthy`.
	members := map[uint64]string{1: "store-1", 2: "store-2", 3: "store-3"}
	for _, st := range stores {
		if r := runEnv(t, bin, nil, "store", "stop", "--data", st.data); r.code != 0 || !strings.Contains(r.stdout, "stopped termlog logstore --id "+st.id) {
			t.Fatalf("store stop --data %s: exit %d\n%s\n%s", st.data, r.code, r.stdout, r.stderr)
		}
		select {
		case err := <-st.p.done:
			if err != nil {
				t.Fatalf("%s exited with %v:\n%s", st.id, err, st.p.errOut.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still running after store stop returned", st.id)
		}
		// The process is reaped: the very first status says so.
		reaped := time.Now()
		code, s, stderr := statusJSON(t, bin)
		took := time.Since(reaped)
		problems := strings.Join(s.Health.Problems, "\n")
		if code != 1 || !strings.Contains(problems, st.id+" stopped for a planned restart at ") || !strings.Contains(problems, "drained until ") || !strings.Contains(problems, "shard 1: 2/3 running") {
			t.Fatalf("first status after %s exited: exit %d, problems:\n%s\nstderr %s", st.id, code, problems, stderr)
		}
		t.Logf("first status after %s's exit: exit %d in %s, problems %q", st.id, code, took.Round(time.Millisecond), s.Health.Problems)
		start(st)
		gate := time.Now()
		if r := runEnv(t, bin, nil, "status", "--wait-healthy", "--timeout", "60s"); r.code != 0 {
			t.Fatalf("after restarting %s: status --wait-healthy exit %d\n%s\n%s", st.id, r.code, r.stdout, r.stderr)
		}
		// Checked from the outside, not by the judge: the restarted
		// store's own /metrics runs its replica, the shard has a Raft
		// leader (the meta leader's /metrics), nothing was replaced.
		if got := scrape(t, st.metrics, "termlog_store_replicas_running", "store")[st.id]; got != 1 {
			t.Fatalf("the gate passed %s after restarting %s, whose /metrics shows %v replicas running", time.Since(gate).Round(time.Millisecond), st.id, got)
		}
		leader := max(scrape(t, metaMetrics, "termlog_shard_leader_known", "shard")["1"], scrape(t, meta2Metrics, "termlog_shard_leader_known", "shard")["1"])
		if leader != 1 {
			t.Fatalf("the gate passed after restarting %s, but no meta leader's /metrics knows shard 1's Raft leader", st.id)
		}
		_, s, _ = statusJSON(t, bin)
		if len(s.Shards) != 1 || !maps.Equal(s.Shards[0].Members, members) || s.Shards[0].Leader == 0 {
			t.Fatalf("after restarting %s: shards %+v, want members %v with a leader", st.id, s.Shards, members)
		}
		t.Logf("%s restarted; the gate passed after %s", st.id, time.Since(gate).Round(time.Millisecond))
	}
	if r := runEnv(t, bin, nil, "replay", "--type", "operator.started"); strings.Contains(r.stdout, "operator.started") {
		t.Fatalf("the rolling restart without pauses started operators:\n%s", r.stdout)
	}

	// Right after `meta stepdown --wait`, status judges the new leader's
	// record: healthy.
	if r := runEnv(t, bin, nil, "meta", "stepdown", "--wait"); r.code != 0 {
		t.Fatalf("meta stepdown --wait: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := runEnv(t, bin, nil, "status"); r.code != 0 {
		t.Fatalf("status right after meta stepdown --wait: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := runEnv(t, bin, nil, "status", "--bogus"); r.code != 2 {
		t.Fatalf("status --bogus: exit %d, want 2 (a usage error)\n%s", r.code, r.stderr)
	}
}
