// Package normalize is the host half of profsym's split: it turns a
// process's native addresses into (file identity, ELF virtual address), the
// form any machine can later symbolize. What a frame needs is captured when
// the process is first seen, so frames survive the process's exit.
package normalize

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/filever"
	"github.com/profsym/profsym/internal/lru"
)

// FileInfo is what a profile needs to know about one mapped file: its
// identities and the PT_LOAD headers that turn file offsets into ELF
// addresses. Computed once per (device, inode, size, mtime).
type FileInfo struct {
	ID         FileID // what the file is cached under; unwind tables use it too
	Path       string // as the process sees it
	GNUBuildID string // lowercase hex, empty when absent
	GoBuildID  string
	HTLHash    string // OpenTelemetry file id: always set when the file was readable
	Size       int64
	Loads      []elfx.Segment
	// Relro is the PT_GNU_RELRO segment (Memsz 0: none), which tells
	// whether the loader has relocated the file in a process.
	Relro elfx.Segment
	// UnwindBytes is the size of the sections an unwind table is built
	// from (.eh_frame, .debug_frame, .gopclntab): what the build costs.
	// Zero when section headers are missing.
	UnwindBytes int64
	Err         error // why identities are missing (unreadable, not ELF, ...)
}

// Mapping is one executable mapping of a process.
type Mapping struct {
	Start, End, Offset uint64
	Path               string // file path, or a pseudo name ("[vdso]", "[anon:...]", "")
	File               *FileInfo
	Anonymous          bool // no file behind it (JIT code, or a deleted file we could not read)
}

// Process is a snapshot of the parts of /proc/PID the profiles need.
type Process struct {
	PID         int
	Comm        string
	ExePath     string
	CgroupPath  string
	ContainerID string // 64 hex, when the process is in a container
	// PodUID and ContainerRuntime are what the cgroup path says of a
	// container's pod and runtime (Cgroup); empty when it does not say.
	PodUID           string
	ContainerRuntime string
	// VPID is the pid the process has in its innermost PID namespace when
	// that is not the reader's (a container's pid 1, say); 0 otherwise.
	VPID     int
	Mappings []Mapping // executable ones, sorted by Start
	ReadAt   time.Time
}

// Find returns the mapping holding addr.
func (p *Process) Find(addr uint64) *Mapping {
	i := sort.Search(len(p.Mappings), func(i int) bool { return p.Mappings[i].End > addr })
	if i < len(p.Mappings) && p.Mappings[i].Start <= addr {
		return &p.Mappings[i]
	}
	return nil
}

// sameFile is what the snapshot before knew of m's file, when it mapped
// the same inode at the same place and could read it; else now. A file
// that can no longer be opened through /proc while the process still maps
// it (a process on its way out) must not lose what its last samples need.
func (p *Process) sameFile(m addrmap.Mapping, now *FileInfo) *FileInfo {
	old := p.Find(m.Start)
	if old == nil || old.Start != m.Start || old.End != m.End || old.Offset != m.Offset || old.Path != m.Path ||
		old.File == nil || old.File.HTLHash == "" || old.File.ID.Ino != m.Inode {
		return now
	}
	return old.File
}

// Normalize maps a process address to the ELF virtual address in its file.
// ok is false for addresses outside file-backed mappings, or when the file's
// program headers do not cover the offset.
func (p *Process) Normalize(addr uint64) (m *Mapping, vaddr uint64, ok bool) {
	m = p.Find(addr)
	if m == nil {
		return nil, 0, false
	}
	if m.File == nil || len(m.File.Loads) == 0 {
		return m, 0, false
	}
	v, ok := addrmap.FileOffsetToVaddr(m.File.Loads, addr-m.Start+m.Offset)
	return m, v, ok
}

// Options configure a Normalizer.
type Options struct {
	ProcRoot string // "/proc" unless testing
	MaxFiles int    // bound on cached FileInfo entries (0: 4096)
}

// Normalizer caches processes and file identities. Safe for concurrent use.
type Normalizer struct {
	proc  string
	files *lru.Cache[fileKey, *FileInfo]

	mu    sync.Mutex
	procs map[int]*Process

	// rootNS is the PID namespace of the proc mount when the agent is
	// in it (its own status has one NSpid): a process in it has no other
	// pid to report, which its ns/pid link tells for a seventh of what
	// its status costs. Read once; "" when the agent is elsewhere or the
	// links are unreadable, and then status is read.
	rootNSOnce sync.Once
	rootNS     string
}

// FileID identifies one version of a file on this host: device, inode,
// size and modification time, as stat(2) gives them.
type FileID = filever.Version

type fileKey = FileID

// New makes a Normalizer.
func New(opt Options) *Normalizer {
	if opt.ProcRoot == "" {
		opt.ProcRoot = "/proc"
	}
	if opt.MaxFiles <= 0 {
		opt.MaxFiles = 4096
	}
	return &Normalizer{proc: opt.ProcRoot, files: lru.New[fileKey, *FileInfo](0, opt.MaxFiles, nil, nil), procs: map[int]*Process{}}
}

// Process returns the cached snapshot of pid, reading it on first use.
func (n *Normalizer) Process(pid int) (*Process, error) {
	n.mu.Lock()
	p := n.procs[pid]
	n.mu.Unlock()
	if p != nil {
		return p, nil
	}
	return n.Refresh(pid)
}

// Cached returns the snapshot of pid if one was taken, without reading /proc.
func (n *Normalizer) Cached(pid int) *Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.procs[pid]
}

// Refresh re-reads pid (new libraries mapped since the last snapshot).
func (n *Normalizer) Refresh(pid int) (*Process, error) {
	p, err := n.read(pid)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.procs[pid] = p
	n.mu.Unlock()
	return p, nil
}

// Forget drops pid's snapshot (after its frames were reported).
func (n *Normalizer) Forget(pid int) {
	n.mu.Lock()
	delete(n.procs, pid)
	n.mu.Unlock()
}

// Tracked is the number of processes with a snapshot.
func (n *Normalizer) Tracked() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.procs)
}

// Alive reports whether pid still exists.
func (n *Normalizer) Alive(pid int) bool {
	_, err := os.Stat(filepath.Join(n.proc, strconv.Itoa(pid)))
	return err == nil
}

// ErrGone is returned for processes that exited before they were read.
var ErrGone = errors.New("process exited")

func (n *Normalizer) read(pid int) (*Process, error) {
	dir := filepath.Join(n.proc, strconv.Itoa(pid))
	f, err := os.Open(filepath.Join(dir, "maps"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrGone)
		}
		return nil, err
	}
	defer f.Close()
	p := &Process{PID: pid, ReadAt: time.Now()}
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		p.Comm = strings.TrimSpace(string(b))
	}
	p.ExePath, _ = os.Readlink(filepath.Join(dir, "exe"))
	p.ExePath = strings.TrimSuffix(p.ExePath, " (deleted)")
	cg := readCgroupFile(filepath.Join(dir, "cgroup"))
	p.CgroupPath, p.ContainerID, p.PodUID, p.ContainerRuntime = cg.Path, cg.ContainerID, cg.PodUID, cg.Runtime
	p.VPID = n.vpid(dir)

	n.mu.Lock()
	prev := n.procs[pid]
	n.mu.Unlock()
	add := func(m addrmap.Mapping) error {
		if m.Perms&addrmap.Exec == 0 {
			return nil
		}
		pm := Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Path: m.Path}
		if m.IsFile() {
			pm.File = n.file(dir, m)
			if pm.File.HTLHash == "" && prev != nil {
				pm.File = prev.sameFile(m, pm.File)
			}
		} else {
			pm.Anonymous = !strings.HasPrefix(m.Path, "[v")
		}
		p.Mappings = append(p.Mappings, pm)
		return nil
	}
	// The kernel's query of executable mappings, where it has one (6.11):
	// no text to format and parse, which is most of the cost of a snapshot.
	err = addrmap.QueryExec(f, add)
	if errors.Is(err, addrmap.ErrQueryUnsupported) {
		err = addrmap.ParseMaps(bufio.NewReader(f), add)
	}
	if err != nil {
		return nil, fmt.Errorf("pid %d maps: %w", pid, err)
	}
	slices.SortFunc(p.Mappings, func(a, b Mapping) int { return cmp.Compare(a.Start, b.Start) })
	return p, nil
}

// vpid is the pid the process in dir has in its own PID namespace, when
// that is not the proc mount's (0 otherwise). Most processes share the
// mount's namespace: comparing the namespace links spares them a status
// file (the kernel formats some 60 lines of it), a quarter of a
// snapshot's CPU.
func (n *Normalizer) vpid(dir string) int {
	n.rootNSOnce.Do(func() {
		self := filepath.Join(n.proc, "self")
		if st, err := os.ReadFile(filepath.Join(self, "status")); err == nil && ReadNSpid(string(st)) == 0 && strings.Contains(string(st), "NSpid:") {
			n.rootNS, _ = os.Readlink(filepath.Join(self, "ns", "pid"))
		}
	})
	if n.rootNS != "" {
		if ns, err := os.Readlink(filepath.Join(dir, "ns", "pid")); err == nil && ns == n.rootNS {
			return 0
		}
	}
	return readVPID(filepath.Join(dir, "status"))
}

// OpenPaths lists where the file mapped at [start, end) from path can be
// opened on this host, through the process's own view of the file system
// (procDir is /proc/PID): map_files works for deleted files and across mount
// namespaces; root/PATH is the fallback when map_files is not readable.
// The symbol uploader opens files the same way.
func OpenPaths(procDir string, start, end uint64, path string) []string {
	var out []string
	if start != 0 && end > start {
		out = append(out, filepath.Join(procDir, "map_files", fmt.Sprintf("%x-%x", start, end)))
	}
	if filepath.IsAbs(path) {
		out = append(out, filepath.Join(procDir, "root", path))
	}
	return out
}

// file opens a mapped file (see OpenPaths).
func (n *Normalizer) file(dir string, m addrmap.Mapping) *FileInfo {
	candidates := OpenPaths(dir, m.Start, m.End, m.Path)
	var lastErr error
	for _, c := range candidates {
		key, err := filever.Stat(c)
		if err != nil {
			lastErr = err
			continue
		}
		if fi, ok := n.files.Get(key); ok {
			return fi
		}
		fi := identify(c, m.Path)
		fi.ID = key
		if fi.Err != nil {
			lastErr = fi.Err
			if c != candidates[len(candidates)-1] {
				continue
			}
			if fi.HTLHash == "" {
				// Not readable at all: the process may have exited
				// between the stat and the open. Cached, that would be
				// this file's answer for every process mapping it.
				return fi
			}
		}
		n.files.Add(key, fi)
		return fi
	}
	return &FileInfo{Path: m.Path, Err: lastErr}
}

// identify reads a file's identities and load segments.
func identify(openPath, path string) *FileInfo {
	fi := &FileInfo{Path: path}
	f, err := elfx.Open(openPath)
	if err != nil {
		fi.Err = err
		// Not ELF (or not parsable): the content hash still identifies
		// it. The same checks apply: a FIFO put in its place must not
		// block, and only head and tail are read.
		if osf, size, oerr := elfx.OpenRegular(openPath, 1<<62); oerr == nil {
			fi.Size = size
			fi.HTLHash, _ = buildid.HTLHash(osf, size)
			osf.Close()
		}
		return fi
	}
	defer f.Close()
	fi.Size = int64(len(f.Bytes()))
	id := buildid.Identify(f)
	fi.GNUBuildID, fi.GoBuildID, fi.HTLHash = id.GNU, id.Go, id.HTL
	fi.Loads = f.Loads()
	fi.Relro = elfx.RelroOf(f.File)
	for _, s := range f.Sections {
		switch s.Name {
		case ".eh_frame", ".debug_frame", ".gopclntab":
			fi.UnwindBytes += int64(s.Size)
		}
	}
	return fi
}
