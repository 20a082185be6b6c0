package lazyfs

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// holder is a process that holds something under a mountpoint, which
// keeps the mount busy.
type holder struct {
	pid   int
	comm  string
	state string   // /proc/<pid>/stat's state: R, S, D (in the kernel, uninterruptible), Z (exited, not reaped)
	what  []string // "cwd", "fd 7 -> /mnt/x", "map /mnt/y"
}

func (h holder) String() string {
	what := h.what
	if len(what) > 3 {
		what = append(what[:3:3], fmt.Sprintf("and %d more", len(h.what)-3))
	}
	return fmt.Sprintf("pid %d (%s, state %s): %s", h.pid, h.comm, h.state, strings.Join(what, ", "))
}

// live: the process can still do something (it has not exited).
func (h holder) live() bool { return h.state != "Z" && h.state != "X" }

// holders lists the processes with a working directory, root, open file
// or mapping under mp (from /proc; readlink there asks no FUSE server).
func holders(mp string) []holder {
	under := func(p string) bool { return p == mp || strings.HasPrefix(p, mp+"/") }
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []holder
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		var what []string
		for _, l := range []string{"cwd", "root", "exe"} {
			if p, err := os.Readlink(filepath.Join(dir, l)); err == nil && under(p) {
				what = append(what, l+" "+p)
			}
		}
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			if p, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && under(p) {
				what = append(what, "fd "+fd.Name()+" -> "+p)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "maps")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if i := strings.IndexByte(line, '/'); i >= 0 && under(line[i:]) {
					what = append(what, "map "+line[i:])
				}
			}
		}
		if len(what) == 0 {
			continue
		}
		h := holder{pid: pid, what: what, comm: "?", state: "?"}
		if b, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
			// pid (comm) state ...: comm may hold spaces and parentheses.
			s := string(b)
			if i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')'); i >= 0 && j > i {
				h.comm = s[i+1 : j]
				if f := strings.Fields(s[j+1:]); len(f) > 0 {
					h.state = f[0]
				}
			}
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

func describeHolders(hs []holder) string {
	if len(hs) == 0 {
		return "no process holds anything under it"
	}
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.String())
	}
	return "held by " + strings.Join(parts, "; ")
}

// closeOnExec marks every descriptor of this process open on path
// close-on-exec (see mount: go-fuse leaves /dev/fuse inheritable).
func closeOnExec(path string) {
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && p == path {
			syscall.CloseOnExec(fd)
		}
	}
}
