package projtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/projections/projtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example in the package documentation is a script that passes as
// written.
func TestDocExample(t *testing.T) {
	src, err := os.ReadFile("projtest.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(src), "// # Worked example: a late expiry from the previous term")
	if !ok {
		t.Fatal("no example in the package doc")
	}
	body, _, ok := strings.Cut(after, "// Had the fold applied")
	if !ok {
		t.Fatal("the example's script does not end before 'Had the fold applied'")
	}
	var script strings.Builder
	started := false
	for _, l := range strings.Split(body, "\n") {
		l, ok := strings.CutPrefix(l, "//\t")
		if !ok {
			if started && strings.TrimSpace(strings.TrimPrefix(l, "//")) == "" {
				script.WriteString("\n")
			}
			continue
		}
		started = true
		script.WriteString(l + "\n")
	}
	if strings.Count(script.String(), "----") < 4 {
		t.Fatalf("example too short:\n%s", script.String())
	}
	path := filepath.Join(t.TempDir(), "example")
	if err := os.WriteFile(path, []byte(script.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	projtest.RunFile(t, path)
}

// The hand-written script of the README ("Your own event mix") passes.
func TestReadmeExample(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(src), "Your own event mix")
	if !ok {
		t.Fatal("README has no own-event-mix example")
	}
	_, after, ok = strings.Cut(after, "```text\n")
	if !ok {
		t.Fatal("README example has no text block")
	}
	block, _, ok := strings.Cut(after, "```")
	if !ok || !strings.Contains(block, "----") {
		t.Fatalf("README example: %q", block)
	}
	path := filepath.Join(t.TempDir(), "readme")
	if err := os.WriteFile(path, []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	projtest.RunFile(t, path)
}

// The kit's own scripts: check, views, snapshots.
func TestKit(t *testing.T) { projtest.RunDir(t, "testdata") }

// A test adds its own command without wrapping Fold.Handle; it sees the
// current view, as the kit's commands do.
func TestOwnCommand(t *testing.T) {
	leaderView := func(s *projections.State, d *datadriven.TestData) (string, error) {
		who := s.Leader + " leads"
		if s.Leader == "" {
			who = "nobody leads"
		}
		out := fmt.Sprintf("%s (term %d) with %d workers", who, s.Term, len(s.Workers))
		if s.Leader != "" {
			out = fmt.Sprintf("%s term %d with %d worker", who, s.Term, len(s.Workers))
		}
		for _, a := range d.CmdArgs {
			if a.Key != "verbose" {
				return "", fmt.Errorf("unknown argument %q: leader-view takes verbose", a.Key)
			}
			out += fmt.Sprintf(", next worker id %d", s.NextWorkerID)
		}
		return out + "\n", nil
	}
	breakEndpoint := func(s *projections.State, d *datadriven.TestData) (string, error) {
		s.Endpoints["b:2"] = 9
		return "endpoint b:2 -> worker 9\n", nil
	}
	projtest.RunDir(t, "testdata/own", projtest.WithCommand("leader-view", leaderView), projtest.WithCommand("break-endpoint", breakEndpoint))
}
