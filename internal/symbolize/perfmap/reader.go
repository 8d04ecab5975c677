package perfmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/frame"
)

// maxStatusSize bounds /proc/PID/status, normally about 1.5 KiB.
const maxStatusSize = 64 << 10

// Reader finds and caches the perf maps of running processes. It reads
// each one through the process's own root (/proc/PID/root), so a JIT in a
// container is found at the /tmp it sees, and rereads a map only when the
// file changed. It is safe for concurrent use.
type Reader struct {
	procRoot string

	mu    sync.Mutex
	procs map[int]*proc
}

// proc is the cached state of one pid. Its mutex serializes loads of that
// pid so that two goroutines do not parse the same file twice.
type proc struct {
	mu    sync.Mutex
	nspid int // the pid as the process sees it; 0 until read
	key   fileKey
	m     *Map
}

// fileKey identifies a version of a file: a replaced file changes dev/ino,
// an appended one its size and mtime.
type fileKey struct {
	dev, ino, size uint64
	mtimeNs        int64
}

// NewReader returns a Reader using procRoot ("" means "/proc").
func NewReader(procRoot string) *Reader {
	if procRoot == "" {
		procRoot = "/proc"
	}
	return &Reader{procRoot: procRoot, procs: make(map[int]*proc)}
}

// Map returns pid's perf map, parsing the file only if it changed since the
// last call. Each call costs a few system calls to check, so a caller
// symbolizing many frames of one process should call Map once and use
// Map.Lookup. A process without a map returns an error wrapping
// frame.ErrNotFound.
func (r *Reader) Map(pid int) (*Map, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("perf map: bad pid %d: %w", pid, frame.ErrNotFound)
	}
	r.mu.Lock()
	p := r.procs[pid]
	if p == nil {
		p = &proc{}
		r.procs[pid] = p
	}
	r.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nspid == 0 {
		p.nspid = r.nsPid(pid)
	}
	f, err := r.open(pid, p.nspid)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("perf map of pid %d: %w", pid, err)
	}
	// O_NONBLOCK kept a FIFO from blocking the open; anything but a regular
	// file (a FIFO, a device) is refused here.
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("perf map of pid %d is not a regular file: %w", pid, frame.ErrCorruptFile)
	}
	if st.Size > MaxFileSize {
		return nil, fmt.Errorf("perf map of pid %d: %d bytes, more than %d: %w", pid, st.Size, MaxFileSize, frame.ErrCorruptFile)
	}
	key := fileKey{dev: st.Dev, ino: st.Ino, size: uint64(st.Size), mtimeNs: st.Mtim.Nano()}
	if p.m != nil && p.key == key {
		return p.m, nil
	}
	m, err := Parse(bufio.NewReaderSize(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("perf map of pid %d: %w", pid, err)
	}
	p.key, p.m = key, m
	return m, nil
}

// Lookup names addr in pid's perf map; see Map for the cost.
func (r *Reader) Lookup(pid int, addr uint64) (name string, start uint64, ok bool) {
	m, err := r.Map(pid)
	if err != nil {
		return "", 0, false
	}
	return m.Lookup(addr)
}

// Forget drops what is cached for pid; call it when the process exits,
// before the pid can be reused.
func (r *Reader) Forget(pid int) {
	r.mu.Lock()
	delete(r.procs, pid)
	r.mu.Unlock()
}

// nsPid returns pid as the process sees it in its own pid namespace (the
// last NSpid field of /proc/PID/status), which is the number a JIT in a
// container puts in its map's name. It falls back to pid when the field is
// missing (kernels before 4.1) or unreadable.
func (r *Reader) nsPid(pid int) int {
	f, err := os.Open(filepath.Join(r.procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return pid
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStatusSize))
	if err != nil {
		return pid
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			return pid
		}
		n, err := strconv.Atoi(string(fields[len(fields)-1]))
		if err != nil || n <= 0 {
			return pid
		}
		return n
	}
	return pid
}

// open opens the process's /tmp/perf-N.map, trying its namespace pid first
// and then the host pid.
func (r *Reader) open(pid, nspid int) (*os.File, error) {
	names := []string{fmt.Sprintf("tmp/perf-%d.map", nspid)}
	if nspid != pid {
		names = append(names, fmt.Sprintf("tmp/perf-%d.map", pid))
	}
	root := filepath.Join(r.procRoot, strconv.Itoa(pid), "root")
	var firstErr error
	for _, name := range names {
		f, err := openInRoot(root, name)
		if err == nil {
			return f, nil
		}
		if firstErr == nil || !errors.Is(err, os.ErrNotExist) {
			firstErr = err
		}
	}
	if errors.Is(firstErr, os.ErrNotExist) {
		return nil, fmt.Errorf("perf map of pid %d: %v: %w", pid, firstErr, frame.ErrNotFound)
	}
	return nil, fmt.Errorf("perf map of pid %d: %w", pid, firstErr)
}

// openInRoot opens name below root as if root were "/": the map lives in a
// filesystem the process controls, and an absolute symlink there (say
// /tmp/perf-1.map -> /etc/shadow) must resolve inside the container, not on
// the host. openat2's RESOLVE_IN_ROOT does exactly that; on kernels without
// it (before 5.6) we refuse symlinks in the last component and a /tmp that
// is not a real directory instead.
func openInRoot(root, name string) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
	dirfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(root, name)), nil
	}
	if err != unix.ENOSYS && err != unix.EPERM {
		return nil, &os.PathError{Op: "openat2", Path: filepath.Join(root, name), Err: err}
	}
	// EPERM: seccomp filters (older container runtimes) deny openat2.
	dir, base := filepath.Split(name)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, filepath.Clean(dir), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: filepath.Join(root, dir), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, dir), Err: unix.ENOTDIR}
	}
	fd, err = unix.Openat(dirfd, filepath.Join(dir, base), flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, name)), nil
}
