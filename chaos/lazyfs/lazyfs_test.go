package lazyfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t *testing.T, p string, data string, sync bool) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func syncPath(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func content(t *testing.T, p string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func crash(t *testing.T, f *FS, o CrashOptions) CrashReport {
	t.Helper()
	rep, err := f.Crash(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crash: %s", rep)
	return rep
}

func want(t *testing.T, p, wantContent string, wantExists bool) {
	t.Helper()
	got, ok := content(t, p)
	if ok != wantExists || got != wantContent {
		t.Fatalf("%s after the crash: exists %v, %q; want exists %v, %q", filepath.Base(p), ok, got, wantExists, wantContent)
	}
}

// Synced bytes survive a crash, the bytes written after the last fsync
// vanish, overwrites and truncates are undone to the synced content.
func TestSyncedSurviveUnsyncedVanish(t *testing.T) {
	for _, mode := range []DirMode{DirsJournal, DirsStrict} {
		t.Run(mode.String(), func(t *testing.T) {
			f := Mount(t, Options{Dirs: mode})
			p := filepath.Join(f.Mountpoint, "log")
			write(t, p, "synced.", true)
			syncPath(t, f.Mountpoint) // the name, in either mode
			write(t, p, "lost.", false)
			// An overwrite of synced bytes and a truncate, both unsynced.
			fd, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fd.WriteAt([]byte("SY"), 0); err != nil {
				t.Fatal(err)
			}
			if err := fd.Truncate(3); err != nil {
				t.Fatal(err)
			}
			fd.Close()
			if got, _ := content(t, p); got != "SYn" {
				t.Fatalf("before the crash the mount shows %q, want %q", got, "SYn")
			}
			rep := crash(t, f, CrashOptions{})
			want(t, p, "synced.", true)
			if rep.Writes != 3 {
				t.Errorf("crash undid %d writes, want 3 (append, overwrite, truncate)", rep.Writes)
			}
			// The mount works after the crash, and a second crash with
			// nothing pending changes nothing.
			write(t, p, "again.", true)
			crash(t, f, CrashOptions{})
			want(t, p, "synced.again.", true)
		})
	}
}

// A write through an O_SYNC handle is durable when it returns.
func TestOSyncWriteIsDurable(t *testing.T) {
	f := Mount(t, Options{})
	p := filepath.Join(f.Mountpoint, "sync")
	fd, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteString("durable"); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	crash(t, f, CrashOptions{})
	want(t, p, "durable", true)
}

// A file that was never synced is gone after the crash, name and all.
func TestUnsyncedFileVanishes(t *testing.T) {
	for _, mode := range []DirMode{DirsJournal, DirsStrict} {
		t.Run(mode.String(), func(t *testing.T) {
			f := Mount(t, Options{Dirs: mode})
			d := filepath.Join(f.Mountpoint, "dir")
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(d, "f"), "x", false)
			crash(t, f, CrashOptions{})
			if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the unsynced dir after the crash: %v, want it gone", err)
			}
		})
	}
}

// DirsJournal: a file's fsync makes its name durable (ext4 commits the
// journal). DirsStrict: the name needs its directory's fsync; without it
// the file and its synced bytes are gone.
func TestCreatedFileFollowsDirSync(t *testing.T) {
	for _, tc := range []struct {
		mode    DirMode
		dirSync bool
		survive bool
	}{
		{DirsJournal, false, true},
		{DirsStrict, false, false},
		{DirsStrict, true, true},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			f := Mount(t, Options{Dirs: tc.mode})
			p := filepath.Join(f.Mountpoint, "blk")
			write(t, p, "data", true)
			if tc.dirSync {
				syncPath(t, f.Mountpoint)
			}
			crash(t, f, CrashOptions{})
			if tc.survive {
				want(t, p, "data", true)
			} else {
				want(t, p, "", false)
			}
		})
	}
}

// The write-temp, fsync, rename idiom: the rename is durable after the
// directory's fsync (DirsStrict) or after any later fsync (DirsJournal);
// before that a crash brings the old file back and the temp file with it.
func TestRenameFollowsDirSync(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    DirMode
		after   func(t *testing.T, f *FS)
		renamed bool
	}{
		{"strict/no-sync", DirsStrict, func(*testing.T, *FS) {}, false},
		{"strict/dir-sync", DirsStrict, func(t *testing.T, f *FS) { syncPath(t, f.Mountpoint) }, true},
		{"strict/other-file-sync", DirsStrict, func(t *testing.T, f *FS) { write(t, filepath.Join(f.Mountpoint, "other"), "o", true) }, false},
		{"journal/no-sync", DirsJournal, func(*testing.T, *FS) {}, false},
		{"journal/other-file-sync", DirsJournal, func(t *testing.T, f *FS) { write(t, filepath.Join(f.Mountpoint, "other"), "o", true) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Mount(t, Options{Dirs: tc.mode})
			final, tmp := filepath.Join(f.Mountpoint, "index"), filepath.Join(f.Mountpoint, "index.tmp")
			write(t, final, "old", true)
			syncPath(t, f.Mountpoint)
			write(t, tmp, "new", true)
			if err := os.Rename(tmp, final); err != nil {
				t.Fatal(err)
			}
			tc.after(t, f)
			crash(t, f, CrashOptions{})
			if tc.renamed {
				want(t, final, "new", true)
				want(t, tmp, "", false)
			} else {
				want(t, final, "old", true)
				if tc.mode == DirsJournal {
					want(t, tmp, "new", true) // its create and fsync were committed before the rename
				}
			}
		})
	}
}

// An unlink that was not made durable is undone; one that was stays.
func TestUnlinkFollowsSync(t *testing.T) {
	f := Mount(t, Options{Dirs: DirsStrict})
	a, b := filepath.Join(f.Mountpoint, "a"), filepath.Join(f.Mountpoint, "b")
	write(t, a, "A", true)
	write(t, b, "B", true)
	syncPath(t, f.Mountpoint)
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	syncPath(t, f.Mountpoint)
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	crash(t, f, CrashOptions{})
	want(t, a, "", false)
	want(t, b, "B", true)
}

// A torn crash keeps a prefix of the newest unsynced write (and the
// file's older unsynced writes: a torn tail), the same prefix for the
// same seed; an unsynced write to another file is still lost.
func TestTornCrashKeepsAPrefix(t *testing.T) {
	run := func(seed uint64) (string, CrashReport) {
		f := Mount(t, Options{})
		p := filepath.Join(f.Mountpoint, "blk")
		write(t, p, "synced|", true)
		write(t, p, "first-unsynced|", false)
		write(t, filepath.Join(f.Mountpoint, "other"), "lost", false)
		write(t, p, "0123456789abcdefghijklmnopqrstuvwxyz", false)
		rep := crash(t, f, CrashOptions{Torn: true, Rand: rand.New(rand.NewPCG(seed, 0))})
		got, _ := content(t, p)
		if _, ok := content(t, filepath.Join(f.Mountpoint, "other")); ok {
			t.Fatal("the other file's unsynced create survived a torn crash")
		}
		return got, rep
	}
	newest := "0123456789abcdefghijklmnopqrstuvwxyz"
	got, rep := run(3)
	if rep.TornOf != len(newest) {
		t.Fatalf("torn write of %d bytes, want the newest (%d)", rep.TornOf, len(newest))
	}
	older := "first-unsynced|"
	kept := rep.TornKept - len(older)
	if wantS := "synced|" + older + newest[:kept]; kept < 0 || got != wantS {
		t.Fatalf("after a torn crash: %q, want %q (the synced bytes, the older unsynced write, and %d bytes of the newest)", got, wantS, kept)
	}
	if again, _ := run(3); again != got {
		t.Fatalf("the same seed tore differently: %q then %q", got, again)
	}
}

// A crash while a process holds a file open is refused (power loss kills
// every process first), and the mount keeps working.
func TestCrashRefusedWhileOpen(t *testing.T) {
	f := Mount(t, Options{})
	p := filepath.Join(f.Mountpoint, "open")
	fd, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Crash(CrashOptions{})
	if err == nil {
		fd.Close()
		t.Fatal("Crash succeeded with a file open")
	}
	// The refusal names its cause and who holds the mount.
	if want := fmt.Sprintf("pid %d (", os.Getpid()); !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "-> "+p) {
		fd.Close()
		t.Fatalf("the refused crash says %q; want EBUSY and %q holding %s", err, want, p)
	}
	fd.Close()
	if got, ok := content(t, p); !ok || got != "" {
		t.Fatalf("the mount after the refused crash: %q, exists %v", got, ok)
	}
	if _, err := f.Crash(CrashOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the unsynced file after the crash: %v", err)
	}
}

// A crash of a mount the kernel still counts busy while no process holds
// anything under it (here a submount; in CI a killed NATS node's last
// references, for seconds after it was reaped) detaches it: the crash
// happens, drops what was not durable, and the mount works again. The
// detached mount's server is joined by Close (goleak checks).
func TestCrashDetachesAMountOnlyTheKernelHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		// Crash detaches only as root (a mount made through fusermount
		// is not the process's to detach), and only root mounts the
		// submount; CI runs as root, so this runs there.
		t.Skip("detaching (and mounting the submount that holds it) needs root")
	}
	f := Mount(t, Options{})
	write(t, filepath.Join(f.Mountpoint, "synced"), "kept", true)
	write(t, filepath.Join(f.Mountpoint, "unsynced"), "lost", false)
	sub := filepath.Join(f.Mountpoint, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, ""); err != nil {
		t.Fatalf("as root, mounting the tmpfs that holds the mount busy: %v", err)
	}
	if hs := holders(f.Mountpoint); len(hs) != 0 {
		t.Fatalf("before the crash, processes hold the mount: %s", describeHolders(hs))
	}
	if _, err := f.Crash(CrashOptions{}); err != nil {
		_ = unix.Unmount(sub, unix.MNT_DETACH)
		t.Fatalf("the crash of a mount only the kernel holds: %v", err)
	}
	if d := f.Stats().Detached; d != 1 {
		t.Fatalf("Stats().Detached = %d after the crash, want 1", d)
	}
	if got, ok := content(t, filepath.Join(f.Mountpoint, "synced")); !ok || got != "kept" {
		t.Fatalf("the synced file after the crash: %q, exists %v", got, ok)
	}
	if _, ok := content(t, filepath.Join(f.Mountpoint, "unsynced")); ok {
		t.Fatal("the unsynced file survived the crash")
	}
	write(t, filepath.Join(f.Mountpoint, "after"), "again", true)
	if got, ok := content(t, filepath.Join(f.Mountpoint, "after")); !ok || got != "again" {
		t.Fatalf("a file written after the crash: %q, exists %v", got, ok)
	}
}

// An rmdir that was not made durable is undone, and a dir made and
// removed again since the last sync leaves nothing behind; every undo
// applies (none is skipped as stale).
func TestRmdirFollowsSync(t *testing.T) {
	for _, mode := range []DirMode{DirsJournal, DirsStrict} {
		t.Run(mode.String(), func(t *testing.T) {
			f := Mount(t, Options{Dirs: mode})
			kept, tmp := filepath.Join(f.Mountpoint, "kept"), filepath.Join(f.Mountpoint, "tmp")
			if err := os.Mkdir(kept, 0o750); err != nil {
				t.Fatal(err)
			}
			syncPath(t, f.Mountpoint)
			if err := os.Remove(kept); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if err := os.Mkdir(tmp, 0o755); err != nil {
					t.Fatal(err)
				}
				write(t, filepath.Join(tmp, "f"), "x", false)
				if err := os.Remove(filepath.Join(tmp, "f")); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(tmp); err != nil {
					t.Fatal(err)
				}
			}
			rep := crash(t, f, CrashOptions{})
			if st, err := os.Stat(kept); err != nil || !st.IsDir() || st.Mode().Perm() != 0o750 {
				t.Fatalf("the removed dir after the crash: %v, %v; want it back, mode 0750", st, err)
			}
			if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the made-and-removed dir after the crash: %v", err)
			}
			if rep.SkippedStale != 0 {
				t.Fatalf("%d undos skipped, want none", rep.SkippedStale)
			}
		})
	}
}

// A mount whose server died (a test process killed while mounted) is
// swept by the next New: no stale mount breaks a later run. The dying
// server is this test binary run again as a helper, SIGKILLed.
func TestStaleMountSwept(t *testing.T) {
	if mnt := os.Getenv("LAZYFS_HELPER_MOUNT"); mnt != "" {
		if _, err := New(filepath.Join(filepath.Dir(mnt), "base"), mnt, Options{}); err != nil {
			fmt.Println("helper:", err)
			os.Exit(1)
		}
		fmt.Println("mounted")
		select {} // until killed
	}
	if err := Check(); err != nil {
		t.Skipf("lazyfs: FUSE mounts are not possible here: %v", err)
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestStaleMountSwept$")
	cmd.Env = append(os.Environ(), "LAZYFS_HELPER_MOUNT="+mnt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "mounted" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %q", line)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	var st syscall.Stat_t
	if err := syscall.Stat(mnt, &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("the dead server's mount: stat %v, want ENOTCONN (a stale mount)", err)
	}
	SweepStale()
	if err := syscall.Stat(mnt, &st); err != nil {
		t.Fatalf("after the sweep: %v", err)
	}
	if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), " "+mnt+" ") {
		t.Fatalf("%s is still mounted after the sweep", mnt)
	}
}

// Unlink and rmdir refuse what they do not remove as a disk does: unlink
// of a directory, rmdir of a file or of a directory that is not empty.
// Nothing is removed.
func TestRemoveRefusals(t *testing.T) {
	f := Mount(t, Options{})
	dir, file := filepath.Join(f.Mountpoint, "d"), filepath.Join(f.Mountpoint, "d", "f")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, file, "x", false)
	for _, c := range []struct {
		what string
		err  error
		want syscall.Errno
	}{
		{"unlink of a directory", syscall.Unlink(dir), syscall.EISDIR},
		{"rmdir of a file", syscall.Rmdir(file), syscall.ENOTDIR},
		{"rmdir of a directory that is not empty", syscall.Rmdir(dir), syscall.ENOTEMPTY},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		}
	}
	want(t, file, "x", true)
}

// The descriptors a mount makes are not inherited by the processes this
// one starts: /dev/fuse (go-fuse opens it without O_CLOEXEC) is marked
// close-on-exec, and nothing under the mount is left open.
func TestMountLeavesNothingInheritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a direct mount (as root) opens /dev/fuse in this process")
	}
	f := Mount(t, Options{})
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	devFuse := 0
	for _, e := range fds {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || p != "/dev/fuse" && !strings.HasPrefix(p, f.Mountpoint) {
			continue
		}
		fd, _ := strconv.Atoi(e.Name())
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			continue // closed meanwhile
		}
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d -> %s is inherited by every process started from here on", fd, p)
		}
		if p == "/dev/fuse" {
			devFuse++
		}
	}
	if devFuse == 0 {
		t.Fatal("no descriptor of /dev/fuse found: the test looks in the wrong place")
	}
}

// Processes started while mounts are made (a power-loss test starts NATS
// nodes and CLIs while it mounts and crashes) hold nothing under the
// mount, so the next crash is not refused as busy. Before the mount held
// ForkLock, a child forked inside go-fuse's poll hack kept the hack's file
// open for its whole life (TestPowerLoss r3-all in CI).
func TestChildrenStartedDuringMountsHoldNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a direct mount (as root) is made without forking fusermount")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1) to start as a child")
	}
	f := Mount(t, Options{})
	stop := make(chan struct{})
	var children []*exec.Cmd
	spawned := make(chan struct{})
	go func() {
		defer close(spawned)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := exec.Command(sleep, "60")
			if c.Start() == nil {
				children = append(children, c)
			}
		}
	}()
	t.Cleanup(func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	const crashes = 100
	for i := range crashes {
		if _, err := f.Crash(CrashOptions{}); err != nil {
			close(stop)
			<-spawned
			t.Fatalf("crash %d of %d with children being started meanwhile: %v", i+1, crashes, err)
		}
	}
	close(stop)
	<-spawned
	if hs := holders(f.Mountpoint); len(hs) != 0 {
		t.Fatalf("after %d mounts beside %d children started: %s", crashes, len(children), describeHolders(hs))
	}
	t.Logf("%d crashes (each a mount) beside %d children started: none holds the mount", crashes, len(children))
}
