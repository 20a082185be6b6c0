package main

import (
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Event is one line of `go test -json` (cmd/test2json).
type Event struct {
	Time    time.Time `json:"Time"`
	Action  string    `json:"Action"`
	Package string    `json:"Package"`
	Test    string    `json:"Test"`
	Elapsed float64   `json:"Elapsed"`
	Output  string    `json:"Output"`
	// ImportPath names the package of a build-output or build-fail
	// event (Go 1.24+).
	ImportPath string `json:"ImportPath"`
}

// test is what the run told of one test (or, with name "", of a
// package's output outside any test).
type test struct {
	pkg, name string
	output    []string
	started   bool
	action    string // pass, fail, skip; "" while it runs
	elapsed   float64
}

// pkgResult is one package's end.
type pkgResult struct {
	name    string
	action  string // pass, fail, skip
	elapsed float64
}

// Run folds the events of one `go test -json` run. It is not safe for
// concurrent use: one goroutine feeds it.
type Run struct {
	tests    map[string]*test // by pkg + "\x00" + name
	order    []*test          // in the order they started
	pkgs     []pkgResult
	build    map[string][]string // build output by import path
	buildBad map[string]bool
}

// NewRun is an empty run.
func NewRun() *Run {
	return &Run{tests: map[string]*test{}, build: map[string][]string{}, buildBad: map[string]bool{}}
}

func (r *Run) get(pkg, name string) *test {
	k := pkg + "\x00" + name
	t := r.tests[k]
	if t == nil {
		t = &test{pkg: pkg, name: name}
		r.tests[k] = t
		r.order = append(r.order, t)
	}
	return t
}

// Add folds e in. It returns the package's result when e ends a package.
func (r *Run) Add(e Event) (pkgResult, bool) {
	switch e.Action {
	case "build-output":
		r.build[importPkg(e.ImportPath)] = append(r.build[e.ImportPath], strings.TrimRight(e.Output, "\n"))
		return pkgResult{}, false
	case "build-fail":
		r.buildBad[importPkg(e.ImportPath)] = true
		return pkgResult{}, false
	}
	t := r.get(e.Package, e.Test)
	switch e.Action {
	case "run":
		t.started = true
	case "output":
		t.output = append(t.output, strings.TrimRight(e.Output, "\n"))
	case "pass", "fail", "skip":
		t.action, t.elapsed = e.Action, e.Elapsed
		if e.Test == "" {
			p := pkgResult{name: e.Package, action: e.Action, elapsed: e.Elapsed}
			r.pkgs = append(r.pkgs, p)
			return p, true
		}
	}
	return pkgResult{}, false
}

// Failure is one failing test (a leaf: a parent that failed only
// because a subtest did is not listed), a test still running when its
// package failed (a timeout, a panic elsewhere), or a package that failed
// outside any test (its build, TestMain, a leak check).
type Failure struct {
	Package, Test string
	Elapsed       float64
	// First is the line that says most of why (see firstError).
	First string
	// Unfinished: the test never ended (its package failed meanwhile).
	Unfinished bool
	output     []string
}

// Failures lists the failures of the run, in the order the tests began.
func (r *Run) Failures() []Failure {
	failedPkg := map[string]bool{}
	for _, p := range r.pkgs {
		if p.action == "fail" {
			failedPkg[p.name] = true
		}
	}
	var out []Failure
	withFailure := map[string]bool{} // packages with a test listed
	for _, t := range r.order {
		if t.name == "" {
			continue
		}
		switch {
		case t.action == "fail" && !r.subtestFailed(t):
			out = append(out, Failure{Package: t.pkg, Test: t.name, Elapsed: t.elapsed, First: firstError(t.output), output: t.output})
			withFailure[t.pkg] = true
		case t.action == "" && t.started && failedPkg[t.pkg] && !r.subtestUnfinished(t):
			pkgOut := r.tests[t.pkg+"\x00"].output
			first := firstError(append(append([]string{}, t.output...), pkgOut...))
			out = append(out, Failure{Package: t.pkg, Test: t.name, First: first, Unfinished: true, output: append(append([]string{}, t.output...), pkgOut...)})
			withFailure[t.pkg] = true
		}
	}
	for ip := range r.buildBad {
		if !failedPkg[ip] {
			failedPkg[ip] = true
		}
	}
	var pkgs []string
	for p := range failedPkg {
		if !withFailure[p] {
			pkgs = append(pkgs, p)
		}
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		var lines []string
		if pt := r.tests[p+"\x00"]; pt != nil {
			lines = pt.output
		}
		if b := r.build[p]; len(b) > 0 {
			lines = append(append([]string{}, b...), lines...)
		}
		out = append(out, Failure{Package: p, First: firstError(lines), output: lines})
	}
	return out
}

// subtestFailed: a subtest of t failed (t failed because of it).
func (r *Run) subtestFailed(t *test) bool {
	for _, o := range r.order {
		if o.pkg == t.pkg && strings.HasPrefix(o.name, t.name+"/") && o.action == "fail" {
			return true
		}
	}
	return false
}

// subtestUnfinished: a subtest of t was also running when the package
// failed (it is the one to name).
func (r *Run) subtestUnfinished(t *test) bool {
	for _, o := range r.order {
		if o.pkg == t.pkg && strings.HasPrefix(o.name, t.name+"/") && o.started && o.action == "" {
			return true
		}
	}
	return false
}

var (
	// fileLine is how testing prefixes t.Log, t.Error and t.Fatal.
	fileLine = regexp.MustCompile(`^\s+[\w./-]+\.go:\d+: `)
	// logLine is a JSON logger's line through t.Log (zerolog's test
	// writer): what a test logs, never why it failed.
	logLine = regexp.MustCompile(`^\s+[\w./-]+\.go:\d+: \{"level":"`)
	framing = regexp.MustCompile(`^(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|FAIL|SKIP)|\s*(PASS|FAIL|ok)\b)`)
	alarms  = []string{"panic: ", "fatal error: ", "WARNING: DATA RACE", "found unexpected goroutines", "test timed out"}
)

// firstError picks the line of a test's output that says why it failed:
// a panic, a race or a leak report first; else the last line testing
// prefixed with its file and line before the end that is not a JSON
// logger's (t.Fatal ends a test, and testing cannot tell an Error from a
// Log in the output; a logger writes on from cleanups after the Fatal);
// else the last line with a file and line; else the first line that
// is not testing's framing.
func firstError(lines []string) string {
	for _, a := range alarms {
		for _, l := range lines {
			if strings.Contains(l, a) {
				return clip(l)
			}
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if fileLine.MatchString(lines[i]) && !logLine.MatchString(lines[i]) {
			return clip(lines[i])
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if fileLine.MatchString(lines[i]) {
			return clip(lines[i])
		}
	}
	for _, l := range lines {
		if strings.TrimSpace(l) != "" && !framing.MatchString(l) && !strings.HasPrefix(l, "# ") {
			return clip(l)
		}
	}
	return "(no output)"
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 220 {
		s = s[:217] + "..."
	}
	return s
}

// LogName is the file, under the log dir, that keeps f's output.
func LogName(f Failure) string {
	name := f.Test
	if name == "" {
		name = "package"
	}
	return filepath.Join(strings.ReplaceAll(f.Package, "/", "_"), strings.NewReplacer("/", "__", " ", "_").Replace(name)+".log")
}

// short drops the module path from a package's name.
func short(pkg, module string) string {
	if module != "" && strings.HasPrefix(pkg, module+"/") {
		return strings.TrimPrefix(pkg, module+"/")
	}
	if pkg == module {
		return "."
	}
	return pkg
}

// PackageLine is the line printed as a package ends.
func PackageLine(p pkgResult, module string) string {
	word := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "skip"}[p.action]
	return fmt.Sprintf("%s %-44s %7.1fs", word, short(p.name, module), p.elapsed)
}

// Summary writes the end of the run: the slowest packages, then every
// failure with its first error and its log, then one verdict line, so
// that the last lines of a red run name what failed and why.
func (r *Run) Summary(w io.Writer, module, logDir string, took time.Duration, exit int, left []string) {
	pkgs := append([]pkgResult{}, r.pkgs...)
	sort.SliceStable(pkgs, func(i, j int) bool { return pkgs[i].elapsed > pkgs[j].elapsed })
	var total float64
	for _, p := range r.pkgs {
		total += p.elapsed
	}
	fmt.Fprintf(w, "\n== slowest packages (of %d; %.0fs of package time in %s of wall time)\n", len(r.pkgs), total, took.Round(time.Second))
	for i, p := range pkgs {
		if i == 6 {
			break
		}
		fmt.Fprintf(w, "   %7.1fs %s\n", p.elapsed, short(p.name, module))
	}
	fails := r.Failures()
	ran, failed, skipped := r.counts()
	if len(left) > 0 {
		fmt.Fprintf(w, "== the tests left %d things behind (a test's cleanup did not run or missed them):\n", len(left))
		for _, l := range left {
			fmt.Fprintf(w, "LEFT %s\n", l)
		}
	}
	if len(fails) == 0 && exit == 0 && len(left) == 0 {
		fmt.Fprintf(w, "== PASS: %d tests passed, %d skipped, %d packages, in %s (full log: %s)\n", ran-skipped, skipped, len(r.pkgs), took.Round(time.Second), filepath.Join(logDir, "test.json"))
		return
	}
	fmt.Fprintf(w, "== %d failures (each one's whole output under %s)\n", len(fails), logDir)
	for _, f := range fails {
		what := f.Test
		switch {
		case f.Test == "":
			what = "(outside any test)"
		case f.Unfinished:
			what += " (still running when its package failed)"
		default:
			what += fmt.Sprintf(" (%.2fs)", f.Elapsed)
		}
		fmt.Fprintf(w, "FAIL %s %s\n     %s\n     log: %s\n", short(f.Package, module), what, f.First, filepath.Join(logDir, LogName(f)))
	}
	if len(fails) == 0 && exit != 0 {
		fmt.Fprintf(w, "     go test exited %d with no test failing: see its output above\n", exit)
	}
	fmt.Fprintf(w, "== FAIL: %d of %d tests failed, %d left behind, %d packages, in %s (go test exit %d)\n", failed, ran, len(left), len(r.pkgs), took.Round(time.Second), exit)
}

// counts are the tests that ended, failed and skipped (subtests count).
func (r *Run) counts() (ran, failed, skipped int) {
	for _, t := range r.order {
		if t.name == "" || t.action == "" {
			continue
		}
		ran++
		switch t.action {
		case "fail":
			if !r.subtestFailed(t) {
				failed++ // a parent failed by its subtest is not one more
			}
		case "skip":
			skipped++
		}
	}
	return ran, failed, skipped
}

// importPkg is the package of a build event's ImportPath ("m/d [m/d.test]"
// is m/d's test build).
func importPkg(ip string) string {
	if i := strings.IndexByte(ip, ' '); i >= 0 {
		return ip[:i]
	}
	return ip
}
