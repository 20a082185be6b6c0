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
	dir := t.TempDir()
	return MountAt(t, filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), opts)
}

// MountAt is Mount with the backing files in base and the mount at
// mountpoint. Register the cleanup of whatever uses the mount (a process)
// after MountAt, so that it runs first.
func MountAt(t testing.TB, base, mountpoint string, opts Options) *FS {
	t.Helper()
	if err := Check(); err != nil {
		t.Skipf("lazyfs: FUSE mounts are not possible here: %v", err)
	}
	f, err := New(base, mountpoint, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the caller's TempDir, so it runs before that is
	// removed: the mount is gone first.
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("lazyfs: %v", err)
		}
	})
	return f
}

// Check is Available, tried once per process.
func Check() error {
	availOnce.Do(func() { availErr = Available() })
	return availErr
}
