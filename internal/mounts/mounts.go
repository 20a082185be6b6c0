// Package mounts lists this machine's mounts of one filesystem type from
// /proc/self/mounts (stdlib only: internal/testsum uses it to find what
// chaos/lazyfs left behind, and chaos/lazyfs to sweep its stale mounts).
package mounts

import (
	"os"
	"strconv"
	"strings"
)

// Of returns the mount points of every mount of filesystem type fstype
// ("fuse.lazyfs"), unescaped; none when /proc/self/mounts is unreadable.
func Of(fstype string) []string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	return parse(string(b), fstype)
}

func parse(table, fstype string) []string {
	var out []string
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == fstype {
			out = append(out, Unescape(f[1]))
		}
	}
	return out
}

// Unescape undoes /proc/mounts' octal escapes (\040 for a space).
func Unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
