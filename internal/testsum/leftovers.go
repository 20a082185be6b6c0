package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/termlog/termlog/internal/mounts"
)

// What a run of this project's tests may leave on the machine when a test
// process dies without its cleanups (killed by a timeout, a signal, a
// crash), each found by a marker of this project's own, never by a broad
// process name:
//   - processes: every process go test starts (test binaries and what
//     they start: NATS nodes, termlog daemons, CLIs) inherits
//     TERMLOG_TEST_RUN=<pid>.<start time> naming the testsum run it belongs
//     to;
//   - network namespaces: chaos/netns names each tln<pid>-..., the pid of
//     the test process that made it;
//   - FUSE mounts: chaos/lazyfs mounts have the type fuse.lazyfs.

// markerVar is the environment variable that marks a run's processes.
const markerVar = "TERMLOG_TEST_RUN"

// netnsPrefix starts the name of every namespace chaos/netns makes.
const netnsPrefix = "tln"

// ownMarker names this testsum process: its pid and the kernel's start
// time of it (a pid alone may be reused).
func ownMarker() string {
	return fmt.Sprintf("%d.%s", os.Getpid(), startTime(os.Getpid()))
}

// startTime is field 22 of /proc/<pid>/stat ("" if there is no such
// process).
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name (field 2) may hold spaces; it ends at the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onwards
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// markerLive reports whether the testsum run marker names still runs.
func markerLive(marker string) bool {
	p, st, ok := strings.Cut(marker, ".")
	pid, err := strconv.Atoi(p)
	if !ok || err != nil || st == "" {
		return false
	}
	return startTime(pid) == st
}

// markedProc is a process that carries a run's marker.
type markedProc struct {
	pid    int
	marker string
	cmd    string
}

func (p markedProc) String() string { return fmt.Sprintf("pid %d (%s)", p.pid, p.cmd) }

// markedProcs are the processes on this machine carrying a run's marker.
func markedProcs() []markedProc {
	ents, _ := os.ReadDir("/proc")
	var out []markedProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if m, ok := strings.CutPrefix(kv, markerVar+"="); ok {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				c := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
				if len(c) > 120 {
					c = c[:120] + "…"
				}
				out = append(out, markedProc{pid: pid, marker: m, cmd: c})
				break
			}
		}
	}
	return out
}

// deadNamespaces are the namespaces chaos/netns made in processes that
// are gone.
func deadNamespaces() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// lazyfsMounts are the mount points of chaos/lazyfs's mounts.
func lazyfsMounts() []string { return mounts.Of("fuse.lazyfs") }

// otherRunLive reports whether a testsum run other than own still has
// processes running (then the mounts may be its, and are left alone).
func otherRunLive(own string) bool {
	for _, p := range markedProcs() {
		if p.marker != own && markerLive(p.marker) {
			return true
		}
	}
	return false
}

// removeNamespace deletes network namespace name.
func removeNamespace(name string) error {
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sweepBefore removes what earlier runs of this project left: processes
// whose run is gone, namespaces of gone processes, and, when no other run
// is live, lazyfs mounts. It says what it removed.
func sweepBefore(w io.Writer, own string) {
	say := func(s string) { fmt.Fprintf(w, "== removing what an earlier run left: %s\n", s) }
	killGoneRuns(say)
	for _, s := range removeDeadNamespaces() {
		say(s)
	}
	if !otherRunLive(own) {
		for _, s := range detachMounts() {
			say(s)
		}
	}
}

// killGoneRuns kills the processes of runs that are gone.
func killGoneRuns(say func(string)) {
	for _, p := range markedProcs() {
		if !markerLive(p.marker) {
			say(fmt.Sprintf("killing %s", p))
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// removeDeadNamespaces removes the namespaces of gone processes, naming each.
func removeDeadNamespaces() []string {
	var out []string
	for _, ns := range deadNamespaces() {
		s := "network namespace " + ns + " (its test process is gone); removed"
		if err := removeNamespace(ns); err != nil {
			s += " failed: " + err.Error()
		}
		out = append(out, s)
	}
	return out
}

// detachMounts detaches every lazyfs mount, naming each. Only when no
// other run is live: a mount may be a running test's.
func detachMounts() []string {
	var out []string
	for _, mp := range lazyfsMounts() {
		s := "lazyfs mount " + mp + "; detached"
		if err := syscall.Unmount(mp, 2 /* MNT_DETACH */); err != nil {
			s += " failed: " + err.Error()
		}
		out = append(out, s)
	}
	return out
}

// checkAfter finds what this run left once go test has ended: its
// processes (given grace to exit), namespaces of gone processes, and
// (when no other run is live) lazyfs mounts. It removes each and names it;
// none is a pass.
func checkAfter(own string, grace time.Duration) []string {
	left := killOwn(own, grace)
	left = append(left, removeDeadNamespaces()...)
	if !otherRunLive(own) {
		left = append(left, detachMounts()...)
	}
	return left
}

// killOwn kills the processes of run own still running after grace,
// naming each.
func killOwn(own string, grace time.Duration) []string {
	var left []string
	deadline := time.Now().Add(grace)
	for {
		var mine []markedProc
		for _, p := range markedProcs() {
			if p.marker == own {
				mine = append(mine, p)
			}
		}
		if len(mine) == 0 || time.Now().After(deadline) {
			for _, p := range mine {
				left = append(left, fmt.Sprintf("process %s still running %s after go test ended; killed", p, grace))
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}
