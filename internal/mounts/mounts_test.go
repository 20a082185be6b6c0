package mounts

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	table := `proc /proc proc rw,nosuid 0 0
lazyfs /tmp/a\040b fuse.lazyfs rw,nosuid,nodev 0 0
lazyfs /tmp/c\134d fuse.lazyfs rw 0 0
other /mnt/x fuse.sshfs rw 0 0
short line
`
	got := parse(table, "fuse.lazyfs")
	if want := []string{"/tmp/a b", `/tmp/c\d`}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for in, want := range map[string]string{`a\040`: "a ", `a\04`: `a\04`, `\0401`: " 1", `a\9x9`: `a\9x9`} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
