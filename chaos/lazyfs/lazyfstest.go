package lazyfs

import (
	"path/filepath"
	"sync"
	"testing"
)

var (
	availOnce sync.Once
	availErr  error
)

// Mount mounts a lazy filesystem under t's temp dir and unmounts it when
// t ends (whether it passed or not); it skips t, saying why, where FUSE
// mounts cannot be made (no /dev/fuse, not root and no fusermount, no
// permission to mount).
func Mount(t testing.TB, opts Options) *FS {
	t.Helper()
	availOnce.Do(func() { availErr = Available() })
	if availErr != nil {
		t.Skipf("lazyfs: FUSE mounts are not possible here: %v", availErr)
	}
	dir := t.TempDir()
	f, err := New(filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), opts)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after TempDir's cleanup, so it runs before it: the mount
	// is gone before its dir is removed.
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("lazyfs: %v", err)
		}
	})
	return f
}
