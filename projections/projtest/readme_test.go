package projtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/termlog/termlog/projections/projtest"
	"github.com/termlog/termlog/replay"
)

// readmeSection is the README's section under the heading, up to the next.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(src), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	sec, _, _ := strings.Cut(after, "\n## ")
	return sec
}

// blocks returns the fenced blocks of lang in text, in order.
func blocks(text, lang string) []string {
	var out []string
	for {
		_, after, ok := strings.Cut(text, "```"+lang+"\n")
		if !ok {
			return out
		}
		b, rest, _ := strings.Cut(after, "```")
		out = append(out, b)
		text = rest
	}
}

// TestReadmeIncident runs the README's "From incident to unit test" on the
// export it names: the conversion's report, the excerpt of the script, the
// Go test, and the rule change with the failure it shows — the change is
// made for real, in an overlay of projections/apply.go, and the test is
// built and run with it (go test -overlay), so the section cannot go stale.
func TestReadmeIncident(t *testing.T) {
	sec := readmeSection(t, "From incident to unit test")
	jsonl, err := os.ReadFile(filepath.Join("..", "..", "replay", "testdata", "logs", "up-stepdown-lease.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var script bytes.Buffer
	st, err := replay.ToScript(context.Background(), replay.JSONL(bytes.NewReader(jsonl)), replay.ScriptOptions{Source: "incident.jsonl"}, &script)
	if err != nil {
		t.Fatal(err)
	}
	// The conversion's report.
	report := fmt.Sprintf("# wrote %d events (seq %d..%d, %d printed one by one) as %d commands to incidents/testdata/stepdown.txt",
		st.Events, st.First, st.Last, st.Printed, st.Commands)
	if !strings.Contains(sec, report+"\n") {
		t.Errorf("the README's conversion report is not %q", report)
	}
	// The excerpt: runs of the script's lines, "..." between them.
	texts := blocks(sec, "text")
	if len(texts) < 2 {
		t.Fatalf("want the excerpt and the failure as text blocks, got %d", len(texts))
	}
	rest := script.String()
	for _, chunk := range strings.Split(texts[0], "...\n") {
		if chunk == "" { // the excerpt ends with "..."
			continue
		}
		i := strings.Index(rest, chunk)
		if i < 0 {
			t.Fatalf("the README's excerpt is not in the script as converted today:\n%s\nscript:\n%s", chunk, script.String())
		}
		rest = rest[i+len(chunk):]
	}
	dir := t.TempDir()
	testdata := filepath.Join(dir, "testdata")
	if err := os.Mkdir(testdata, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testdata, "stepdown.txt")
	if err := os.WriteFile(path, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// Today's rules pass it.
	projtest.RunFile(t, path)

	if testing.Short() {
		t.Skip("builds the kit with the README's rule change")
	}
	// The README's test, in this package (its testdata is the temp dir).
	gos := blocks(sec, "go")
	if len(gos) != 1 || !strings.Contains(gos[0], "package incidents_test") || !strings.Contains(gos[0], `projtest.RunDir(t, "testdata")`) {
		t.Fatalf("want the README's one Go test calling RunDir(t, \"testdata\"), got %q", gos)
	}
	test := strings.Replace(gos[0], "package incidents_test", "package projtest_test", 1)
	test = strings.Replace(test, `projtest.RunDir(t, "testdata")`, "projtest.RunDir(t, "+strconv.Quote(testdata)+")", 1)
	// The README's rule change, applied to apply.go.
	diffs := blocks(sec, "diff")
	if len(diffs) != 1 {
		t.Fatalf("want one diff block, got %d", len(diffs))
	}
	var old, changed string
	for _, l := range strings.Split(strings.TrimSpace(diffs[0]), "\n") {
		switch {
		case strings.HasPrefix(l, "-"):
			old += l[1:] + "\n"
		case strings.HasPrefix(l, "+"):
			changed += l[1:] + "\n"
		}
	}
	apply, err := filepath.Abs(filepath.Join("..", "apply.go"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(apply)
	if err != nil {
		t.Fatal(err)
	}
	if old == "" || strings.Count(string(src), old) != 1 {
		t.Fatalf("the README's change does not apply to projections/apply.go: %q", old)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		apply: strings.Replace(string(src), old, changed, 1),
		filepath.Join(here, "zz_readme_incident_test.go"): test,
	}
	overlay := map[string]map[string]string{"Replace": {}}
	for target, body := range files {
		f := filepath.Join(dir, filepath.Base(target))
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay["Replace"][target] = f
	}
	ov, _ := json.Marshal(overlay)
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "test", "-count=1", "-overlay", ovPath, "-run", "^TestIncidents$", ".")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the README's rule change does not fail the incident:\n%s", out)
	}
	for _, l := range strings.Split(texts[1], "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(string(out), l) {
			t.Errorf("with the README's change, the failure lacks %q:\n%s", l, out)
		}
	}
}
