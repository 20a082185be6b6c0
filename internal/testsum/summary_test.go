package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// stream is a `go test -json` run, one event a line, with the module
// "m": a subtest that fails (its parent fails only because of it; a
// logger writes after its Fatal, as a cleanup does), a
// test still running when its package timed out, a package whose
// TestMain failed after every test passed, a build failure, a pass.
const stream = `
{"Action":"run","Package":"m/a","Test":"TestParent"}
{"Action":"run","Package":"m/a","Test":"TestParent/sub"}
{"Action":"output","Package":"m/a","Test":"TestParent/sub","Output":"=== RUN   TestParent/sub\n"}
{"Action":"output","Package":"m/a","Test":"TestParent/sub","Output":"    a_test.go:10: started 3 nodes\n"}
{"Action":"output","Package":"m/a","Test":"TestParent/sub","Output":"    a_test.go:20: crash of nats-3: device or resource busy\n"}
{"Action":"output","Package":"m/a","Test":"TestParent/sub","Output":"    writer.go:27: {\"level\":\"info\",\"message\":\"stopped leading\"}\n"}
{"Action":"output","Package":"m/a","Test":"TestParent/sub","Output":"--- FAIL: TestParent/sub (18.53s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestParent/sub","Elapsed":18.53}
{"Action":"fail","Package":"m/a","Test":"TestParent","Elapsed":18.6}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"pass","Package":"m/a","Test":"TestOK","Elapsed":0.1}
{"Action":"output","Package":"m/a","Output":"FAIL\n"}
{"Action":"fail","Package":"m/a","Elapsed":20.1}
{"Action":"run","Package":"m/b","Test":"TestHangs"}
{"Action":"output","Package":"m/b","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}
{"Action":"output","Package":"m/b","Output":"panic: test timed out after 10m0s\n"}
{"Action":"output","Package":"m/b","Output":"\trunning tests:\n"}
{"Action":"fail","Package":"m/b","Elapsed":600.2}
{"Action":"run","Package":"m/c","Test":"TestFine"}
{"Action":"pass","Package":"m/c","Test":"TestFine","Elapsed":1}
{"Action":"output","Package":"m/c","Output":"goleak: Errors on successful test run: found unexpected goroutines:\n"}
{"Action":"fail","Package":"m/c","Elapsed":1.5}
{"ImportPath":"m/d [m/d.test]","Action":"build-output","Output":"# m/d\n"}
{"ImportPath":"m/d [m/d.test]","Action":"build-output","Output":"d/d.go:3:1: syntax error: non-declaration statement outside function body\n"}
{"ImportPath":"m/d [m/d.test]","Action":"build-fail"}
{"Action":"start","Package":"m/d"}
{"Action":"output","Package":"m/d","Output":"FAIL\tm/d [build failed]\n"}
{"Action":"fail","Package":"m/d","Elapsed":0}
{"Action":"run","Package":"m/e","Test":"TestGood"}
{"Action":"pass","Package":"m/e","Test":"TestGood","Elapsed":2}
{"Action":"pass","Package":"m/e","Elapsed":2.5}
`

func fold(t *testing.T, s string) *Run {
	t.Helper()
	r := NewRun()
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		r.Add(e)
	}
	return r
}

func TestFailuresNameEachCause(t *testing.T) {
	fails := fold(t, stream).Failures()
	type want struct{ pkg, test, first string }
	wants := []want{
		{"m/a", "TestParent/sub", "a_test.go:20: crash of nats-3: device or resource busy"},
		{"m/b", "TestHangs", "panic: test timed out after 10m0s"},
		{"m/c", "", "goleak: Errors on successful test run: found unexpected goroutines:"},
		{"m/d", "", "d/d.go:3:1: syntax error: non-declaration statement outside function body"},
	}
	if len(fails) != len(wants) {
		t.Fatalf("%d failures %+v, want %d", len(fails), fails, len(wants))
	}
	for i, w := range wants {
		f := fails[i]
		if f.Package != w.pkg || f.Test != w.test || f.First != w.first {
			t.Errorf("failure %d: %s %q %q, want %s %q %q", i, f.Package, f.Test, f.First, w.pkg, w.test, w.first)
		}
	}
	if !fails[1].Unfinished {
		t.Errorf("the test running at the timeout is not marked unfinished")
	}
}

// The verdict and every failure are in the last 20 lines, package names
// without the module.
func TestSummaryEndsWithTheFailures(t *testing.T) {
	var b strings.Builder
	fold(t, stream).Summary(&b, "m", "/tmp/logs", 3*time.Minute, 1, nil)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	last := strings.Join(lines[max(0, len(lines)-20):], "\n")
	for _, s := range []string{
		"FAIL a TestParent/sub (18.53s)", "a_test.go:20: crash of nats-3", "log: /tmp/logs/m_a/TestParent__sub.log",
		"FAIL b TestHangs (still running when its package failed)", "panic: test timed out",
		"FAIL c (outside any test)", "FAIL d (outside any test)", "syntax error",
		"== FAIL: 1 of 5 tests failed",
	} {
		if !strings.Contains(last, s) {
			t.Errorf("the last 20 lines lack %q:\n%s", s, last)
		}
	}
	if strings.Contains(last, "FAIL a TestParent (") {
		t.Errorf("the parent that failed only by its subtest is listed:\n%s", last)
	}
	if !strings.Contains(b.String(), "600.2s b") {
		t.Errorf("the slowest package is not shown with its time:\n%s", b.String())
	}
}

func TestSummaryOfAGreenRun(t *testing.T) {
	var b strings.Builder
	fold(t, `{"Action":"run","Package":"m/e","Test":"TestGood"}
{"Action":"pass","Package":"m/e","Test":"TestGood","Elapsed":2}
{"Action":"pass","Package":"m/e","Elapsed":2.5}`).Summary(&b, "m", "/l", time.Second, 0, nil)
	if !strings.Contains(b.String(), "== PASS: 1 tests passed, 0 skipped, 1 packages") {
		t.Fatalf("summary:\n%s", b.String())
	}
}

// A red exit with nothing failing in the JSON (go test refused its
// flags) still ends red, pointing at go test's own output.
func TestSummaryOfAnExitWithoutFailures(t *testing.T) {
	var b strings.Builder
	NewRun().Summary(&b, "m", "/l", time.Second, 2, nil)
	if !strings.Contains(b.String(), "go test exited 2 with no test failing") || !strings.Contains(b.String(), "== FAIL") {
		t.Fatalf("summary:\n%s", b.String())
	}
}

// What a run left is in its last lines and makes it red.
func TestSummaryOfARunThatLeftSomething(t *testing.T) {
	var b strings.Builder
	fold(t, `{"Action":"pass","Package":"m/e","Elapsed":2.5}`).Summary(&b, "m", "/l", time.Second, 0, []string{"process pid 7 (nats-server) still running 5s after go test ended; killed"})
	if !strings.Contains(b.String(), "LEFT process pid 7 (nats-server)") || !strings.Contains(b.String(), "== FAIL: 0 of 0 tests failed, 1 left behind") {
		t.Fatalf("summary:\n%s", b.String())
	}
}
