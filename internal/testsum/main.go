// Command testsum runs `go test -json` with the arguments it is given and
// prints what a person needs from a long run: a line as each package ends
// (with its time), each failing test as it fails, and at the end a
// summary that fits in the last lines of a CI log — the slowest
// packages, every failing test with its package, the line that says why
// and the file that keeps its whole output, and one verdict line. It
// never reruns a failure. Its exit status is go test's.
//
//	go run ./internal/testsum -race -count=1 ./...
//
// The whole run's JSON and one log file per failure are kept in a new
// directory under $TMPDIR (or $TERMLOG_TEST_LOGS when set), named at the
// start and at the end. Before go test starts it removes what an earlier,
// interrupted run of this project left (leftovers.go); after it ends it
// checks that this run left nothing, and a run that did fails.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	logDir, err := newLogDir()
	if err != nil {
		fmt.Fprintf(stderr, "testsum: %v\n", err)
		return 2
	}
	raw, err := os.Create(filepath.Join(logDir, "test.json"))
	if err != nil {
		fmt.Fprintf(stderr, "testsum: %v\n", err)
		return 2
	}
	defer raw.Close()
	module := modulePath()
	fmt.Fprintf(stdout, "== go test -json %s (logs: %s)\n", strings.Join(args, " "), logDir)

	own := ownMarker()
	sweepBefore(stdout, own)
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Env = append(os.Environ(), markerVar+"="+own)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "testsum: %v\n", err)
		return 2
	}
	// An interrupt reaches go test through the terminal's process group;
	// testsum waits for its end and still prints the summary.
	signal.Ignore(syscall.SIGINT)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "testsum: start go test: %v\n", err)
		return 2
	}
	r := NewRun()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		raw.Write(line)
		raw.Write([]byte{'\n'})
		var e Event
		if json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(stdout, string(line)) // not JSON: go test's own words
			continue
		}
		if p, ended := r.Add(e); ended {
			fmt.Fprintln(stdout, PackageLine(p, module))
		}
		if e.Action == "fail" && e.Test != "" {
			fmt.Fprintf(stdout, "     --- FAIL %s (%.2fs)\n", e.Test, e.Elapsed)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(stderr, "testsum: reading go test's output: %v\n", err)
	}
	exit := 0
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			fmt.Fprintf(stderr, "testsum: go test: %v\n", err)
			exit = 2
		} else if exit = ee.ExitCode(); exit < 0 {
			exit = 2 // killed by a signal
		}
	}
	left := checkAfter(own, 5*time.Second)
	fails := r.Failures()
	for _, f := range fails {
		p := filepath.Join(logDir, LogName(f))
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		_ = os.WriteFile(p, []byte(strings.Join(f.output, "\n")+"\n"), 0o644)
	}
	r.Summary(stdout, module, logDir, time.Since(start), exit, left)
	if exit == 0 && (len(fails) > 0 || len(left) > 0) {
		exit = 1
	}
	return exit
}

// newLogDir makes the directory that keeps this run's logs.
func newLogDir() (string, error) {
	base := os.Getenv("TERMLOG_TEST_LOGS")
	if base == "" {
		base = os.TempDir()
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(base, "termlog-test-"+time.Now().UTC().Format("20060102T150405")+"-")
}

// modulePath is the module in the current directory ("" if none), to
// print package names without it.
func modulePath() string {
	b, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
