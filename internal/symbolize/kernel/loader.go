package kernel

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRefreshInterval is how often, at most, a Loader rereads kallsyms
// because a lookup missed outside the core kernel's text. Parsing takes
// tens of milliseconds, and a miss that persists (an address in a freed
// module, a BPF program kallsyms does not list) must not make every lookup
// pay for it.
const DefaultRefreshInterval = 10 * time.Second

// Loader keeps a parsed kallsyms table and the kernel's Info, and rereads
// them when a module (or BPF program, or ftrace trampoline) may have
// appeared. It is safe for concurrent use; lookups never wait for a reload
// running in another goroutine.
type Loader struct {
	procRoot, sysRoot string
	interval          time.Duration
	now               func() time.Time

	table atomic.Pointer[Table]
	info  atomic.Pointer[Info]

	mu       sync.Mutex // held while loading
	loadedAt time.Time  // under mu
	loadErr  error      // under mu: the last load's error
	loads    atomic.Int64
}

// NewLoader returns a Loader reading procRoot/kallsyms and sysRoot's notes
// ("" means "/proc" and "/sys"). Nothing is read until first use. An
// interval of 0 selects DefaultRefreshInterval.
func NewLoader(procRoot, sysRoot string, interval time.Duration) *Loader {
	if procRoot == "" {
		procRoot = "/proc"
	}
	if interval <= 0 {
		interval = DefaultRefreshInterval
	}
	return &Loader{procRoot: procRoot, sysRoot: sysRoot, interval: interval, now: time.Now}
}

// Table returns the current table, loading it on first use.
func (l *Loader) Table() (*Table, error) {
	if t := l.table.Load(); t != nil {
		return t, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.table.Load(); t != nil {
		return t, nil
	}
	// A failed first load is retried at most once per interval, so that a
	// host with kptr_restrict set does not reparse kallsyms per frame.
	if l.loadErr != nil && l.now().Sub(l.loadedAt) < l.interval {
		return nil, l.loadErr
	}
	if err := l.loadLocked(); err != nil {
		return nil, err
	}
	return l.table.Load(), nil
}

// Info returns the kernel's release and build ids, read with the table.
func (l *Loader) Info() (Info, error) {
	if _, err := l.Table(); err != nil {
		return Info{}, err
	}
	return *l.info.Load(), nil
}

// Lookup names a kernel address. A miss outside the core kernel's text
// rereads kallsyms (at most once per interval, and only in the goroutine
// that wins the lock) in case a module was loaded since.
func (l *Loader) Lookup(addr uint64) (name, module string, start uint64, ok bool) {
	t, err := l.Table()
	if err != nil {
		return "", "", 0, false
	}
	if name, module, start, ok = t.Lookup(addr); ok || t.inCoreText(addr) {
		return name, module, start, ok
	}
	if !l.mu.TryLock() {
		return "", "", 0, false
	}
	reloaded := false
	if l.now().Sub(l.loadedAt) >= l.interval {
		reloaded = l.loadLocked() == nil
	}
	l.mu.Unlock()
	if !reloaded {
		return "", "", 0, false
	}
	return l.table.Load().Lookup(addr)
}

// Refresh rereads kallsyms and the build ids now. On error the previous
// table stays in use.
func (l *Loader) Refresh() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loadLocked()
}

// Loads returns how many times kallsyms was read, for metrics and tests.
func (l *Loader) Loads() int64 { return l.loads.Load() }

func (l *Loader) loadLocked() error {
	l.loadedAt = l.now()
	l.loads.Add(1)
	t, err := l.parse()
	l.loadErr = err
	if err != nil {
		return err
	}
	// Build ids are optional: a kernel without readable notes still
	// symbolizes, so ReadInfo's error only leaves fields empty.
	info, _ := ReadInfo(l.sysRoot)
	l.info.Store(&info)
	l.table.Store(t)
	return nil
}

func (l *Loader) parse() (*Table, error) {
	path := filepath.Join(l.procRoot, "kallsyms")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := ParseKallsyms(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}
