package console

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestAlertRules: docs/prometheus/alerts.yml passes promtool's check, and
// alerts_test.yml proves the no-leader and no-quorum alerts fire on
// synthetic series (and not before their time).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool on PATH (apt-get install -y prometheus; .ci/run installs it)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../docs/prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboardMetrics: the Grafana dashboard parses and every metric it
// queries is one termlog serves (the names in cmd/termlog/metrics.go) or
// the Go and process collectors'.
func TestDashboardMetrics(t *testing.T) {
	b, err := os.ReadFile("../docs/grafana/termlog.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	src, err := os.ReadFile("../cmd/termlog/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{"termlog_build_info": true}
	for _, m := range regexp.MustCompile(`desc\("([a-z_]+)"`).FindAllSubmatch(src, -1) {
		served["termlog_"+string(m[1])] = true
	}
	alerts, _ := os.ReadFile("../docs/prometheus/alerts.yml")
	exprs := []string{string(alerts)}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, e := range exprs {
		for _, name := range regexp.MustCompile(`\btermlog_[a-z_]*[a-z]\b`).FindAllString(e, -1) {
			if !served[name] {
				t.Errorf("%s is not a metric termlog serves", name)
			}
		}
	}
}
