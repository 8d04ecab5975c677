package runtimes

import (
	"sync"

	"github.com/profsym/profsym/internal/lru"
)

// MemFiles keeps the memory files of the processes whose frames a runtime
// names open, at most n, the least recently used closed first: naming a
// report's frames reads each process many times. Reads go one at a time:
// opening one process's file may close the file another read is using.
type MemFiles struct {
	root string
	mu   sync.Mutex
	lru  *lru.Cache[int, *Mem]
}

// NewMemFiles keeps up to n files of the processes under procRoot open.
func NewMemFiles(procRoot string, n int) *MemFiles {
	return &MemFiles{root: procRoot, lru: lru.New[int, *Mem](0, n, nil, func(_ int, m *Mem) { _ = m.Close() })}
}

// Do runs read with pid's memory file, opened if it is not; read must not
// keep the file.
func (mf *MemFiles) Do(pid int, read func(*Mem) error) error {
	mf.mu.Lock()
	defer mf.mu.Unlock()
	m, ok := mf.lru.Get(pid)
	if !ok {
		var err error
		if m, err = OpenMem(mf.root, pid); err != nil {
			return err
		}
		mf.lru.Add(pid, m)
	}
	return read(m)
}

// Forget closes pid's file (the process exited).
func (mf *MemFiles) Forget(pid int) {
	mf.mu.Lock()
	mf.lru.Remove(pid)
	mf.mu.Unlock()
}

// Close closes every file kept open: the agent is stopping (a collector
// reload would otherwise leave them open until the garbage collector
// finalized them).
func (mf *MemFiles) Close() {
	mf.mu.Lock()
	defer mf.mu.Unlock()
	mf.lru.EvictWhere(func(int, *Mem) bool { return true }, func() bool { return false })
}

// NameErrors names a walker's failure counts (its enum of reasons, as the
// BPF counters' array, summed over CPUs): the reasons counted, a value
// names does not know as "unknown".
func NameErrors[K ~uint32](counts []uint64, names map[K]string) map[string]uint64 {
	out := map[string]uint64{}
	for i, n := range counts {
		if n == 0 {
			continue
		}
		name, ok := names[K(i)]
		if !ok {
			name = "unknown"
		}
		out[name] += n
	}
	return out
}

// MemRead runs read with pid's memory file (MemFiles.Do) and returns what
// it read.
func MemRead[T any](mf *MemFiles, pid int, read func(*Mem) (T, error)) (T, error) {
	var out T
	err := mf.Do(pid, func(m *Mem) (err error) {
		out, err = read(m)
		return err
	})
	return out, err
}
