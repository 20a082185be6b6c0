package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a loopback node that records, under its FS's lock, how to undo
// each change it makes.
type node struct {
	gofs.LoopbackNode
	f   *FS
	gen *mountGen
}

// rel is the node's path relative to the backing root.
func (n *node) rel() string { return n.Path(nil) }

// ino is the backing inode (on one device the loopback's inode number is
// the backing one).
func (n *node) ino() uint64 { return n.StableAttr().Ino }

// lock takes the FS lock; false (and unlocked) when this mount is dead.
func (n *node) lock() bool {
	n.f.mu.Lock()
	if n.gen.dead {
		n.f.mu.Unlock()
		return false
	}
	return true
}

func lstat(p string) (syscall.Stat_t, bool) {
	var st syscall.Stat_t
	return st, syscall.Lstat(p, &st) == nil
}

// readAll is the content of p (for a truncate's undo).
func readAll(p string) []byte {
	b, _ := os.ReadFile(p)
	return b
}

var (
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeFsyncer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*node)(nil)
)

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if !n.lock() {
		return nil, nil, 0, syscall.EIO
	}
	f := n.f
	defer f.mu.Unlock()
	rel := filepath.Join(n.rel(), name)
	pre, existed := lstat(f.abs(rel))
	if existed && flags&syscall.O_TRUNC != 0 && pre.Mode&syscall.S_IFMT == syscall.S_IFREG && pre.Size > 0 {
		f.record(&entry{k: kSize, ino: pre.Ino, oldSize: pre.Size, old: readAll(f.abs(rel))})
	}
	ch, fh, ff, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	st, _ := lstat(f.abs(rel))
	if !existed {
		f.paths[st.Ino] = rel
		f.record(&entry{k: kCreate, ino: st.Ino, dir: n.ino(), path: rel})
	}
	return ch, f.wrap(fh, st.Ino, flags), ff, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if !n.lock() {
		return nil, 0, syscall.EIO
	}
	f := n.f
	defer f.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 {
		if st, ok := lstat(f.abs(n.rel())); ok && st.Size > 0 && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			f.record(&entry{k: kSize, ino: n.ino(), oldSize: st.Size, old: readAll(f.abs(n.rel()))})
		}
	}
	fh, ff, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return f.wrap(fh, n.ino(), flags), ff, 0
}

// named records a name made in n (f.mu held).
func (n *node) named(k kind, name string) {
	rel := filepath.Join(n.rel(), name)
	if st, ok := lstat(n.f.abs(rel)); ok {
		n.f.paths[st.Ino] = rel
		n.f.record(&entry{k: k, ino: st.Ino, dir: n.ino(), path: rel})
	}
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(kMkdir, name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(kCreate, name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeEntry(kCreate, name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

// makeEntry runs the loopback's making of name (do) under f.mu and records it
// as k when it succeeds.
func (n *node) makeEntry(k kind, name string, do func() (*gofs.Inode, syscall.Errno)) (*gofs.Inode, syscall.Errno) {
	if !n.lock() {
		return nil, syscall.EIO
	}
	defer n.f.mu.Unlock()
	ch, errno := do()
	if errno == 0 {
		n.named(k, name)
	}
	return ch, errno
}

// Link is refused: hard links would need a model of their own.
func (n *node) Link(context.Context, gofs.InodeEmbedder, string, *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.ENOTSUP
}

// CopyFileRange is refused, so the kernel copies with reads and writes
// (which are recorded).
func (n *node) CopyFileRange(context.Context, gofs.FileHandle, uint64, *gofs.Inode, gofs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOTSUP
}

func (n *node) Unlink(_ context.Context, name string) syscall.Errno {
	return n.remove(name, false)
}

func (n *node) Rmdir(_ context.Context, name string) syscall.Errno {
	return n.remove(name, true)
}

// remove unlinks the file name (dir false) or removes the empty directory
// name (dir true). Either goes into the trash, so its inode number is not
// reused while the removal may still be undone.
func (n *node) remove(name string, dir bool) syscall.Errno {
	if !n.lock() {
		return syscall.EIO
	}
	f := n.f
	defer f.mu.Unlock()
	rel := filepath.Join(n.rel(), name)
	st, ok := lstat(f.abs(rel))
	if !ok {
		return syscall.ENOENT
	}
	isDir := st.Mode&syscall.S_IFMT == syscall.S_IFDIR
	switch {
	case isDir && !dir:
		return syscall.EISDIR
	case !isDir && dir:
		return syscall.ENOTDIR
	}
	k := kUnlink
	if dir {
		k = kRmdir
		if ents, err := os.ReadDir(f.abs(rel)); err != nil {
			return gofs.ToErrno(err)
		} else if len(ents) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	trash, err := f.toTrash(rel)
	if err != nil {
		return gofs.ToErrno(err)
	}
	f.record(&entry{k: k, ino: st.Ino, dir: n.ino(), path: rel, trash: trash})
	return 0
}

func (n *node) Rename(_ context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.ENOTSUP // RENAME_EXCHANGE, RENAME_WHITEOUT
	}
	if !n.lock() {
		return syscall.EIO
	}
	f := n.f
	defer f.mu.Unlock()
	from, to := filepath.Join(n.rel(), name), filepath.Join(np.rel(), newName)
	src, ok := lstat(f.abs(from))
	if !ok {
		return syscall.ENOENT
	}
	e := &entry{k: kRename, ino: src.Ino, dir: np.ino(), path: from, path2: to}
	if dst, ok := lstat(f.abs(to)); ok {
		if dst.Ino == src.Ino {
			return 0
		}
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		srcDir, dstDir := src.Mode&syscall.S_IFMT == syscall.S_IFDIR, dst.Mode&syscall.S_IFMT == syscall.S_IFDIR
		switch {
		case srcDir && !dstDir:
			return syscall.ENOTDIR
		case !srcDir && dstDir:
			return syscall.EISDIR
		case dstDir:
			if ents, _ := os.ReadDir(f.abs(to)); len(ents) > 0 {
				return syscall.ENOTEMPTY
			}
		}
		trash, err := f.toTrash(to)
		if err != nil {
			return gofs.ToErrno(err)
		}
		e.victim, e.trash = dst.Ino, trash
	}
	if err := os.Rename(f.abs(from), f.abs(to)); err != nil {
		if e.victim != 0 {
			_ = os.Rename(filepath.Join(f.base, e.trash), f.abs(to))
			f.movePaths("\x00trash/"+e.trash, to)
		}
		return gofs.ToErrno(err)
	}
	f.movePaths(from, to)
	f.record(e)
	return 0
}

// unwrap is the loopback's own handle under ours.
func unwrap(fh gofs.FileHandle) gofs.FileHandle {
	if h, ok := fh.(*handle); ok {
		return h.inner
	}
	return fh
}

func (n *node) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return n.LoopbackNode.Getattr(ctx, unwrap(fh), out)
}

func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	size, resize := in.GetSize()
	if !resize {
		return n.LoopbackNode.Setattr(ctx, unwrap(fh), in, out)
	}
	if !n.lock() {
		return syscall.EIO
	}
	f := n.f
	defer f.mu.Unlock()
	st, ok := lstat(f.abs(n.rel()))
	if h, isH := fh.(*handle); isH {
		ok = syscall.Fstat(h.fd, &st) == nil
	}
	var e *entry
	if ok && int64(size) != st.Size {
		e = &entry{k: kSize, ino: n.ino(), oldSize: st.Size}
		if int64(size) < st.Size {
			// The tail the truncate cuts.
			e.off = int64(size)
			e.old = make([]byte, st.Size-int64(size))
			var m int
			if h, isH := fh.(*handle); isH {
				m, _ = preadAny(h.fd, e.old, e.off)
			} else if fd, err := syscall.Open(f.abs(n.rel()), syscall.O_RDONLY, 0); err == nil {
				m, _ = syscall.Pread(fd, e.old, e.off)
				syscall.Close(fd)
			}
			e.old = e.old[:max(m, 0)]
		}
	}
	errno := n.LoopbackNode.Setattr(ctx, unwrap(fh), in, out)
	if errno == 0 && e != nil {
		f.record(e)
	}
	return errno
}

// Fsync is fsync and fdatasync of a file, and fsync of a directory
// (through a handle without Fsyncdir).
func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return n.f.fsync(ctx, n, fh, flags)
}

func (f *FS) fsync(ctx context.Context, n *node, fh gofs.FileHandle, flags uint32) syscall.Errno {
	if !n.lock() {
		return syscall.EIO
	}
	upto := n.f.seq
	dir := n.IsDir()
	if dir {
		f.stats.DirFsyncs++
	} else {
		f.stats.Fsyncs++
	}
	f.mu.Unlock()
	// The backing file's own fsync, outside the lock (it is slow); only
	// what was recorded before it counts as synced.
	var errno syscall.Errno
	switch h := fh.(type) {
	case *handle:
		errno = gofs.ToErrno(syscall.Fsync(h.fd))
	case *dirHandle:
		errno = h.ds.Fsyncdir(ctx, flags)
	default:
		fd, err := syscall.Open(f.abs(n.rel()), syscall.O_RDONLY, 0)
		if err != nil {
			return gofs.ToErrno(err)
		}
		errno = gofs.ToErrno(syscall.Fsync(fd))
		syscall.Close(fd)
	}
	if errno != 0 {
		return errno
	}
	if !n.lock() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	if dir {
		f.syncDir(n.ino(), upto)
	} else {
		f.syncData(n.ino(), upto)
	}
	return 0
}

// dirStream is what the loopback's directory handle does.
type dirStream interface {
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileReleasedirer
	gofs.FileFsyncdirer
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, ff, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	ds, ok := fh.(dirStream)
	if !ok {
		return fh, ff, 0
	}
	return &dirHandle{ds: ds, n: n}, ff, 0
}

// dirHandle is a directory handle whose fsync commits the directory.
type dirHandle struct {
	ds dirStream
	n  *node
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.ds.Readdirent(ctx)
}
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.Seekdir(ctx, off)
}
func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) { d.ds.Releasedir(ctx, flags) }
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.f.fsync(ctx, d.n, d, flags)
}

// handle is an open file: every write records the bytes it overwrites.
type handle struct {
	inner interface {
		gofs.FileReader
		gofs.FileWriter
		gofs.FileReleaser
		gofs.FileFlusher
		gofs.FileGetattrer
		gofs.FileLseeker
		gofs.FileAllocater
		gofs.FileGetlker
		gofs.FileSetlker
		gofs.FileSetlkwer
	}
	fd   int
	ino  uint64
	sync bool // opened O_SYNC or O_DSYNC: every write is durable
	f    *FS
	gen  *mountGen
}

func (f *FS) wrap(fh gofs.FileHandle, ino uint64, flags uint32) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return fh
	}
	fd, _ := lf.PassthroughFd()
	return &handle{inner: lf, fd: fd, ino: ino, sync: flags&syscall.O_DSYNC != 0, f: f, gen: f.gen}
}

func (h *handle) lock() bool {
	h.f.mu.Lock()
	if h.gen.dead {
		h.f.mu.Unlock()
		return false
	}
	return true
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.inner.Read(ctx, dest, off)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.lock() {
		return 0, syscall.EIO
	}
	f := h.f
	defer f.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd, &st); err != nil {
		return 0, gofs.ToErrno(err)
	}
	var old []byte
	if off < st.Size {
		old = make([]byte, min(int64(len(data)), st.Size-off))
		m, err := preadAny(h.fd, old, off)
		if err != nil {
			return 0, gofs.ToErrno(err)
		}
		old = old[:m]
	}
	w, errno := h.inner.Write(ctx, data, off)
	if w == 0 && errno != 0 {
		return 0, errno
	}
	if int(w) < len(old) {
		old = old[:w]
	}
	e := &entry{k: kWrite, ino: h.ino, off: off, old: old, oldSize: st.Size, n: int(w)}
	f.record(e)
	f.stats.Writes++
	if h.sync {
		f.stats.Fsyncs++
		f.syncData(h.ino, e.seq)
	}
	return w, errno
}

func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&^unix.FALLOC_FL_KEEP_SIZE != 0 {
		return syscall.ENOTSUP // punching holes changes content: not modelled
	}
	if !h.lock() {
		return syscall.EIO
	}
	defer h.f.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	if errno := h.inner.Allocate(ctx, off, size, mode); errno != 0 {
		return errno
	}
	var now syscall.Stat_t
	if syscall.Fstat(h.fd, &now) == nil && now.Size != st.Size {
		h.f.record(&entry{k: kSize, ino: h.ino, oldSize: st.Size})
	}
	return 0
}

func (h *handle) Release(ctx context.Context) syscall.Errno { return h.inner.Release(ctx) }
func (h *handle) Flush(ctx context.Context) syscall.Errno   { return h.inner.Flush(ctx) }
func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.inner.Getattr(ctx, out)
}
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.inner.Lseek(ctx, off, whence)
}
func (h *handle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return h.inner.Getlk(ctx, owner, lk, flags, out)
}
func (h *handle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.inner.Setlk(ctx, owner, lk, flags)
}
func (h *handle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.inner.Setlkw(ctx, owner, lk, flags)
}

// preadAny reads from fd even when it was opened write-only (through a
// second, read-only open of the same inode).
func preadAny(fd int, b []byte, off int64) (int, error) {
	m, err := syscall.Pread(fd, b, off)
	if !errors.Is(err, syscall.EBADF) {
		return m, err
	}
	rfd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", fd), syscall.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(rfd)
	return syscall.Pread(rfd, b, off)
}
