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

	"github.com/profsym/profsym/internal/filever"
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
	key   filever.Version
	m     *Map
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
	key, regular, err := filever.Fstat(f)
	if err != nil {
		return nil, fmt.Errorf("perf map of pid %d: %w", pid, err)
	}
	// O_NONBLOCK kept a FIFO from blocking the open; anything but a regular
	// file (a FIFO, a device) is refused here.
	if !regular {
		return nil, fmt.Errorf("perf map of pid %d is not a regular file: %w", pid, frame.ErrCorruptFile)
	}
	if key.Size > MaxFileSize {
		return nil, fmt.Errorf("perf map of pid %d: %d bytes, more than %d: %w", pid, key.Size, MaxFileSize, frame.ErrCorruptFile)
	}
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
