// Package lazyfs is a FUSE filesystem for power-loss tests: a loopback
// mount of a backing directory that remembers every change the kernel
// has not been told to make durable, and a Crash that forgets them.
//
// The idea is Jepsen's LazyFS: a write is lost on a crash unless an
// fsync, fdatasync or an O_SYNC/O_DSYNC write made it durable. This
// implementation writes through to the backing directory at once (so
// reads are plain loopback reads) and keeps, in memory, how to undo each
// change that is not durable yet: the bytes a write overwrote and the
// size before it, the tail a truncate cut, the namespace operation a
// create, mkdir, rename or unlink did. Observed from the mount that is
// the same as keeping the unsynced writes in memory: Crash unmounts,
// undoes every change that was not durable, newest first, and mounts
// again, so the mount shows exactly the durable state.
//
// What becomes durable when (Linux, modelled conservatively):
//
//   - File data: an fsync or fdatasync of the file (any handle), or a
//     write through a handle opened O_SYNC or O_DSYNC. Nothing else; in
//     particular no periodic writeback, so the mount loses more than a
//     real disk would (an ext4 kernel writes dirty pages back within 30 s,
//     and commits its journal every 5 s).
//   - Names (create, mkdir, symlink, rename, unlink, rmdir), two modes:
//     DirsJournal (the default) is ext4's: the namespace is a journal and
//     any fsync, of a file or a directory, commits every namespace change
//     made before it (ext4's fsync commits the running jbd2 transaction,
//     which holds every metadata change so far). DirsStrict is POSIX's
//     letter: a name is durable only after an fsync of its directory (for
//     a rename, of the destination's); a file created and fsynced in a
//     directory that was never fsynced vanishes on a crash. DirsStrict
//     undoes out of order (a change whose directory was synced stays
//     while older ones are undone), so each undo checks that the name
//     still names the same inode and skips it otherwise.
//   - Hard links and RENAME_EXCHANGE are refused (ENOTSUP): no caller
//     here needs them, and they would need a model of their own.
//
// A torn crash (CrashOptions.Torn) keeps a seeded prefix of the newest
// write that was not durable, as a disk that had written part of it
// would.
package lazyfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/termlog/termlog/internal/mounts"
)

// DirMode says when a namespace change becomes durable.
type DirMode int

const (
	// DirsJournal: any fsync commits every namespace change before it
	// (ext4's journal).
	DirsJournal DirMode = iota
	// DirsStrict: a name is durable only after an fsync of its
	// directory (POSIX).
	DirsStrict
)

func (m DirMode) String() string {
	if m == DirsStrict {
		return "strict"
	}
	return "journal"
}

// ParseDirMode accepts journal (or "") and strict.
func ParseDirMode(s string) (DirMode, error) {
	switch s {
	case "", "journal":
		return DirsJournal, nil
	case "strict":
		return DirsStrict, nil
	}
	return 0, fmt.Errorf("lazyfs dir mode %q: want journal or strict", s)
}

// Options configures a mount.
type Options struct {
	Dirs DirMode
}

// CrashOptions configures one Crash.
type CrashOptions struct {
	// Torn keeps a prefix (of a length drawn from Rand) of the newest
	// write that was not durable, and every older unsynced write to the
	// same file (a disk that wrote the file in order and lost power in
	// the middle of its last write: a torn tail).
	Torn bool
	Rand *rand.Rand
}

// CrashReport says what a Crash dropped.
type CrashReport struct {
	Writes       int   // writes (or truncates, allocations) undone
	Bytes        int64 // bytes of data those writes had written
	Names        int   // namespace changes undone
	TornKept     int   // bytes of the newest write a torn crash kept
	TornOf       int   // the length of that write
	SkippedStale int   // DirsStrict: undos skipped because a newer durable change moved the name
}

func (r CrashReport) String() string {
	s := fmt.Sprintf("%d unsynced writes (%d bytes) and %d namespace changes dropped", r.Writes, r.Bytes, r.Names)
	if r.TornOf > 0 {
		s += fmt.Sprintf("; torn: kept %d unsynced bytes of the file of the newest write (%d bytes long)", r.TornKept, r.TornOf)
	}
	if r.SkippedStale > 0 {
		s += fmt.Sprintf("; %d undos skipped (name moved by a durable change)", r.SkippedStale)
	}
	return s
}

// Stats counts what a mount saw (since New).
type Stats struct {
	Writes, Fsyncs, DirFsyncs, Crashes int
	// Detached: crashes that found the mount busy with no live process
	// holding it, and detached it (MNT_DETACH) instead of unmounting.
	Detached int
}

type kind int

const (
	kWrite  kind = iota // data: overwrote old at off, size was oldSize
	kSize               // data: truncate or allocate; size was oldSize, the cut tail is old at off
	kCreate             // name: path was created (file, symlink, node)
	kMkdir              // name: dir path was created
	kRename             // name: path moved to path2; the victim at path2 went to trash
	kUnlink             // name: path went to trash
	kRmdir              // name: dir path removed (it was empty)
)

type entry struct {
	k       kind
	seq     uint64
	ino     uint64 // the file (data) or the inode named (names)
	dir     uint64 // names: the directory whose fsync makes it durable (rename: the destination)
	off     int64
	old     []byte
	oldSize int64
	n       int    // kWrite: bytes written
	path    string // relative to the backing root
	path2   string // kRename: the new name
	trash   string // kRename (victim) / kUnlink: where the inode went, relative to the base
	victim  uint64 // kRename: the inode the rename replaced (0: none)
	done    bool
}

func (e *entry) data() bool { return e.k == kWrite || e.k == kSize }

// FS is one lazy mount: Mountpoint shows Backing's files.
type FS struct {
	Mountpoint string
	Backing    string
	base       string // holds the backing dir and the trash
	opts       Options

	mu     sync.Mutex
	srv    *fuse.Server
	gen    *mountGen
	seq    uint64
	log    []*entry
	live   int                 // entries not done
	byIno  map[uint64][]*entry // pending data entries per inode
	names  []*entry            // pending namespace entries
	paths  map[uint64]string   // inode -> its path relative to Backing ("" for the root)
	trashN int
	stats  Stats
	closed bool
	// detached: servers of mounts Crash detached (the kernel held them
	// busy); Close joins them. Only Crash and Close touch it (one caller
	// at a time, the test's).
	detached []*fuse.Server
}

// mountGen is one mount's life: after Crash or Close its nodes refuse
// every operation (a request the kernel read before the unmount must not
// change the backing files after the crash).
type mountGen struct{ dead bool }

// New mounts a lazy view of base/data at mountpoint (both are created; the
// trash lives in base/trash). The caller must Close it; tests use Mount.
func New(base, mountpoint string, opts Options) (*FS, error) {
	SweepStale()
	f := &FS{Mountpoint: mountpoint, Backing: filepath.Join(base, "data"), base: base, opts: opts,
		byIno: map[uint64][]*entry{}, paths: map[uint64]string{}}
	for _, d := range []string{f.Backing, filepath.Join(base, "trash"), mountpoint} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) mount() error {
	if err := f.scan(); err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(f.Backing, &st); err != nil {
		return err
	}
	gen := &mountGen{}
	lr := &gofs.LoopbackRoot{Path: f.Backing, Dev: uint64(st.Dev)}
	lr.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder {
		return &node{LoopbackNode: gofs.LoopbackNode{RootData: r}, f: f, gen: gen}
	}
	root := lr.NewNode(lr, nil, "", &st)
	lr.RootNode = root
	zero := time.Duration(0)
	direct := os.Geteuid() == 0
	if direct {
		// go-fuse makes two descriptors without O_CLOEXEC: /dev/fuse (a
		// direct mount) and, in WaitMount's poll hack, a file under the
		// mount it opens and closes again. A child this process starts
		// meanwhile (a NATS node on another mount, a CLI the test runs)
		// inherits them: one under the mount keeps it busy for the
		// child's whole life, so a crash is refused (TestPowerLoss r3-all:
		// "held by pid N (termlog, state S): fd 21 -> .../.go-fuse-epoll-hack"),
		// and /dev/fuse held by a child keeps the FUSE connection alive
		// after this process dies (its mount then hangs every access
		// instead of failing). ForkLock held for reading is Go's rule for
		// making a descriptor that is not close-on-exec yet: no fork
		// happens until the hack's file is closed and /dev/fuse is marked.
		// (Not through fusermount: that is a fork of its own, and go-fuse
		// marks the descriptor it gets back.)
		syscall.ForkLock.RLock()
		defer syscall.ForkLock.RUnlock()
	}
	srv, err := gofs.Mount(f.Mountpoint, root, &gofs.Options{
		// No kernel caching of names or attributes across requests: what
		// the process sees is what the backing files say.
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "lazyfs:" + f.Backing, Name: "lazyfs",
			// As root go-fuse mounts with mount(2) itself: no fusermount.
			// Strict: an unmount that fails says why (EBUSY), instead
			// of falling back to a fusermount that is not installed.
			DirectMount: direct, DirectMountStrict: direct,
			// go-fuse never asks for the kernel's writeback cache, so a
			// write reaches this process before write(2) returns: the
			// kernel keeps no dirty pages of its own for the mount.
			DisableXAttrs: true,
		},
	})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", f.Mountpoint, err)
	}
	if direct {
		closeOnExec("/dev/fuse")
	}
	f.mu.Lock()
	f.srv, f.gen = srv, gen
	f.mu.Unlock()
	return nil
}

// scan maps every inode under Backing to its path.
func (f *FS) scan() error {
	paths := map[uint64]string{}
	err := filepath.WalkDir(f.Backing, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(f.Backing, p)
		if rel == "." {
			rel = ""
		}
		paths[st.Ino] = rel
		return nil
	})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.paths = paths
	f.mu.Unlock()
	return nil
}

// unmount ends the current mount (its nodes refuse everything after).
func (f *FS) unmount() error {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	if srv == nil {
		return nil
	}
	if err := srv.Unmount(); err != nil {
		return fmt.Errorf("lazyfs: unmount %s: %w (%s)", f.Mountpoint, err, describeHolders(holders(f.Mountpoint)))
	}
	f.kill()
	return nil
}

// kill ends the current mount's generation, and returns its server: a
// request the kernel handed over before the unmount, and that has not
// taken the lock yet, is refused from here on.
func (f *FS) kill() *fuse.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	srv := f.srv
	f.srv = nil
	f.gen.dead = true
	return srv
}

// detach ends the current mount when the kernel still counts it busy
// although no process that could still act holds anything under it (the
// killed process's last references, which the kernel lets go of on its
// own time: ci11 and ci29 saw a mount busy for seconds after its only
// user was reaped). The generation dies first, so whatever still reaches
// the old mount changes nothing; then the mount is detached (MNT_DETACH)
// and its server is joined when the kernel lets go (Close). A power loss
// does not wait for the kernel either.
func (f *FS) detach(cause error) error {
	hs := holders(f.Mountpoint)
	for _, h := range hs {
		if h.live() {
			return fmt.Errorf("%w; a process that can still act holds it: %s", cause, h)
		}
	}
	f.detached = append(f.detached, f.kill())
	f.mu.Lock()
	f.stats.Detached++
	f.mu.Unlock()
	if err := unix.Unmount(f.Mountpoint, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("%w; detaching it failed too: %v", cause, err)
	}
	return nil
}

// Crash simulates a power loss: it unmounts (the processes using the
// mount must be dead: kill them first, as power loss does), undoes every
// change that was not durable, newest first, and mounts again. A mount
// the kernel still counts busy with no live process holding it is
// detached instead (see detach); one a live process holds is refused.
func (f *FS) Crash(o CrashOptions) (CrashReport, error) {
	if err := f.unmount(); err != nil {
		if !errors.Is(err, syscall.EBUSY) || os.Geteuid() != 0 {
			return CrashReport{}, err
		}
		if err := f.detach(err); err != nil {
			return CrashReport{}, err
		}
	}
	f.mu.Lock()
	rep := f.rollback(o)
	f.stats.Crashes++
	f.mu.Unlock()
	if err := f.mount(); err != nil {
		return rep, err
	}
	return rep, nil
}

// Close unmounts (lazily, MNT_DETACH, if a process still holds it) and
// keeps the backing files as they are (everything counts as durable).
// It joins the servers of detached mounts, waiting up to 10 s for the
// kernel to let go of them.
func (f *FS) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	var errs []error
	if err := f.unmount(); err != nil {
		if derr := unix.Unmount(f.Mountpoint, unix.MNT_DETACH); derr != nil {
			errs = append(errs, err, derr)
		}
	}
	for _, srv := range f.detached {
		done := make(chan struct{})
		go func() { srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			errs = append(errs, fmt.Errorf("lazyfs: the server of a mount detached at %s still serves 10s after Close: the kernel holds it (%s)", f.Mountpoint, describeHolders(holders(f.Mountpoint))))
		}
	}
	return errors.Join(errs...)
}

// Stats returns the mount's counters.
func (f *FS) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Pending is how many changes a crash now would drop.
func (f *FS) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live
}

// record appends e (f.mu held).
func (f *FS) record(e *entry) {
	f.seq++
	e.seq = f.seq
	f.log = append(f.log, e)
	f.live++
	if e.data() {
		f.byIno[e.ino] = append(f.byIno[e.ino], e)
	} else {
		f.names = append(f.names, e)
	}
}

func (f *FS) finish(e *entry) {
	if e.done {
		return
	}
	e.done = true
	f.live--
	if e.trash != "" {
		// The removal is durable: the inode's name is gone for good (an
		// open handle keeps the inode itself).
		_ = os.RemoveAll(filepath.Join(f.base, e.trash))
		f.dropPaths("\x00trash/" + e.trash)
	}
}

// compact drops done entries once they are most of the log.
func (f *FS) compact() {
	if len(f.log) < 1024 || f.live*2 > len(f.log) {
		return
	}
	out := f.log[:0]
	for _, e := range f.log {
		if !e.done {
			out = append(out, e)
		}
	}
	clear(f.log[len(out):])
	f.log = out
}

// syncData makes ino's data written up to seq durable; in DirsJournal
// mode every namespace change up to seq too (f.mu held).
func (f *FS) syncData(ino, upto uint64) {
	keep := f.byIno[ino][:0]
	for _, e := range f.byIno[ino] {
		if e.seq <= upto {
			f.finish(e)
		} else {
			keep = append(keep, e)
		}
	}
	if len(keep) == 0 {
		delete(f.byIno, ino)
	} else {
		f.byIno[ino] = keep
	}
	if f.opts.Dirs == DirsJournal {
		f.syncNames(func(*entry) bool { return true }, upto)
	}
	f.compact()
}

// syncDir makes the namespace changes in dir up to seq durable (every
// namespace change in DirsJournal mode) (f.mu held).
func (f *FS) syncDir(dir, upto uint64) {
	f.syncNames(func(e *entry) bool { return f.opts.Dirs == DirsJournal || e.dir == dir }, upto)
	f.compact()
}

func (f *FS) syncNames(match func(*entry) bool, upto uint64) {
	keep := f.names[:0]
	for _, e := range f.names {
		if e.seq <= upto && match(e) {
			f.finish(e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(f.names[len(keep):])
	f.names = keep
}

// rollback undoes every pending entry, newest first (f.mu held; the
// mount is down).
func (f *FS) rollback(o CrashOptions) CrashReport {
	var rep CrashReport
	torn := -1 // index of the newest pending write
	if o.Torn {
		for i := len(f.log) - 1; i >= 0; i-- {
			if e := f.log[i]; !e.done && e.k == kWrite && e.n > 0 {
				torn = i
				break
			}
		}
	}
	for i := len(f.log) - 1; i >= 0; i-- {
		e := f.log[i]
		if e.done {
			continue
		}
		if e.data() {
			if torn >= 0 && i < torn && e.ino == f.log[torn].ino {
				// The torn file's older unsynced writes reached the
				// disk before its newest one began.
				rep.TornKept += e.n
				continue
			}
			keep := 0
			if i == torn {
				r := o.Rand
				if r == nil {
					r = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
				}
				keep = r.IntN(e.n)
				rep.TornKept += keep
				rep.TornOf = e.n
			}
			f.undoData(e, keep)
			rep.Writes++
			rep.Bytes += int64(e.n)
			continue
		}
		if !f.undoName(e) {
			rep.SkippedStale++
			continue
		}
		rep.Names++
	}
	f.log, f.names, f.byIno, f.live = nil, nil, map[uint64][]*entry{}, 0
	// Whatever is still in the trash was removed durably.
	trash := filepath.Join(f.base, "trash")
	_ = os.RemoveAll(trash)
	_ = os.MkdirAll(trash, 0o755)
	return rep
}

func (f *FS) abs(rel string) string { return filepath.Join(f.Backing, rel) }

// inoAt is the inode at rel (0: none).
func (f *FS) inoAt(rel string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Lstat(f.abs(rel), &st); err != nil {
		return 0
	}
	return st.Ino
}

func (f *FS) undoData(e *entry, keep int) {
	rel, ok := f.paths[e.ino]
	if !ok {
		return // its name is gone durably (or never was durable): nothing to restore
	}
	p := f.abs(rel)
	fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	switch e.k {
	case kWrite:
		if keep < len(e.old) {
			_, _ = syscall.Pwrite(fd, e.old[keep:], e.off+int64(keep))
		}
		size := e.oldSize
		if end := e.off + int64(keep); end > size {
			size = end
		}
		_ = syscall.Ftruncate(fd, size)
	case kSize:
		_ = syscall.Ftruncate(fd, e.oldSize)
		if len(e.old) > 0 {
			_, _ = syscall.Pwrite(fd, e.old, e.off)
		}
	}
}

// movePaths renames every mapped path at or under from to the same place
// under to (f.mu held).
func (f *FS) movePaths(from, to string) {
	for ino, p := range f.paths {
		if p == from {
			f.paths[ino] = to
		} else if strings.HasPrefix(p, from+"/") {
			f.paths[ino] = to + p[len(from):]
		}
	}
}

func (f *FS) dropPaths(under string) {
	for ino, p := range f.paths {
		if p == under || strings.HasPrefix(p, under+"/") {
			delete(f.paths, ino)
		}
	}
}

// undoName reverses one namespace change; false when the name no longer
// names the inode it changed (DirsStrict: a newer durable change moved it).
func (f *FS) undoName(e *entry) bool {
	switch e.k {
	case kCreate, kMkdir:
		if f.inoAt(e.path) != e.ino {
			return false
		}
		_ = os.RemoveAll(f.abs(e.path))
		f.dropPaths(e.path)
	case kRename:
		if f.inoAt(e.path2) != e.ino || f.inoAt(e.path) != 0 {
			return false
		}
		if err := os.Rename(f.abs(e.path2), f.abs(e.path)); err != nil {
			return false
		}
		f.movePaths(e.path2, e.path)
		if e.victim != 0 {
			if err := os.Rename(filepath.Join(f.base, e.trash), f.abs(e.path2)); err == nil {
				f.movePaths("\x00trash/"+e.trash, e.path2)
			}
		}
	case kUnlink, kRmdir:
		if f.inoAt(e.path) != 0 {
			return false
		}
		if err := os.Rename(filepath.Join(f.base, e.trash), f.abs(e.path)); err != nil {
			return false
		}
		f.movePaths("\x00trash/"+e.trash, e.path)
	}
	return true
}

// toTrash moves the inode at rel into the trash (f.mu held) and returns
// its trash name (relative to base).
func (f *FS) toTrash(rel string) (string, error) {
	f.trashN++
	name := filepath.Join("trash", fmt.Sprintf("%d", f.trashN))
	if err := os.Rename(f.abs(rel), filepath.Join(f.base, name)); err != nil {
		return "", err
	}
	// Paths in the trash are kept under a prefix no real path has.
	f.movePaths(rel, "\x00trash/"+name)
	return name, nil
}

// SweepStale lazily unmounts lazyfs mounts whose server is gone (a test
// process that died mounted leaves one behind: every access to it fails
// with ENOTCONN). Live mounts of other processes are left alone.
func SweepStale() {
	for _, mp := range mounts.Of("fuse.lazyfs") {
		var st syscall.Stat_t
		if err := syscall.Stat(mp, &st); errors.Is(err, syscall.ENOTCONN) {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
}

// Available says why lazy mounts cannot work here (nil: they can): it
// mounts one in a temp dir and unmounts it.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("no /dev/fuse: %w", err)
	}
	if os.Geteuid() != 0 {
		if _, err := lookPath("fusermount3", "fusermount"); err != nil {
			return errors.New("not root and no fusermount in PATH")
		}
	}
	dir, err := os.MkdirTemp("", "lazyfs-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := New(filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), Options{})
	if err != nil {
		return err
	}
	return f.Close()
}

func lookPath(names ...string) (string, error) {
	var err error
	for _, n := range names {
		var p string
		if p, err = exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", err
}
