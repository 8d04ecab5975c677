package runtimes

import (
	"errors"
	"maps"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/unwind"
)

// Unwinder is the part of unwind.Manager a Set drives.
type Unwinder interface {
	SetRuntime(pid int, rt unwind.Runtime) error
}

// Label is one pprof label of a sample (Go: runtime/pprof labels).
type Label struct{ Key, Value string }

// Labeler reads the labels samples point at (golabels): it is given every
// process snapshot and exit, like a Runtime.
type Labeler interface {
	Attach(p *normalize.Process)
	Forget(pid int)
	Labels(pid int, ptr uint64) []Label
	Stats() LabelStats
	// Reading is how many processes' labels it reads now.
	Reading() int
	Close()
}

// Watcher is told of every process snapshot and exit, like a Runtime
// (threadctx). It reads nothing at the drain: Walking does not count it.
type Watcher interface {
	Attach(p *normalize.Process)
	Forget(pid int)
	Close()
}

// LabelStats count what a Labeler did, cumulatively.
type LabelStats struct {
	Attached uint64            // processes whose labels are read
	Refused  map[string]uint64 // processes whose labels cannot be, by reason
	Read     uint64            // label sets read from a process
	Failed   uint64            // label sets that could not be read
}

// Set holds the runtimes a sampler walks. Safe for concurrent use.
type Set struct {
	rts    []Runtime
	unw    Unwinder
	log    *zap.Logger
	labels Labeler // nil: samples carry no labels
	watch  []Watcher

	mu     sync.Mutex
	procs  map[int]Runtime // which runtime each attached process runs
	failed map[int]bool    // processes whose failure was logged and counted
	// read is when the newest snapshot attached of each process was read.
	// Snapshots taken on two goroutines can arrive out of order; an older
	// one (a vfork child's before its exec, a JVM's before its dlopen)
	// would undo what a newer one found: a runtime forgotten, a JVM's
	// count of failed attaches started again.
	read  map[int]time.Time
	stats Stats
}

// Stats count what a Set did, cumulatively.
type Stats struct {
	Attached uint64            // processes whose runtime the walker takes
	Failed   map[string]uint64 // processes running a runtime that cannot be walked, by runtime
	Named    uint64            // frames named
	Unnamed  map[string]uint64 // frames left unnamed, by reason
}

// NewSet makes a Set over rts (nil entries are skipped), telling unw which
// process runs which.
func NewSet(log *zap.Logger, unw Unwinder, rts ...Runtime) *Set {
	s := &Set{
		unw: unw, log: log, procs: map[int]Runtime{}, failed: map[int]bool{}, read: map[int]time.Time{},
		stats: Stats{Failed: map[string]uint64{}, Unnamed: map[string]uint64{}},
	}
	for _, r := range rts {
		if r != nil {
			s.rts = append(s.rts, r)
		}
	}
	return s
}

// Attach finds the runtime p runs, if any, and hands its code to that
// runtime's walker. Called on every snapshot of p (new process, exec,
// mappings changed).
func (s *Set) Attach(p *normalize.Process) {
	if s == nil || p == nil {
		return
	}
	if !p.ReadAt.IsZero() {
		s.mu.Lock()
		last, ok := s.read[p.PID]
		stale := ok && p.ReadAt.Before(last)
		if !stale {
			s.read[p.PID] = p.ReadAt
		}
		s.mu.Unlock()
		if stale {
			s.log.Debug("older snapshot than the one attached, skipped", zap.Int("pid", p.PID))
			return
		}
	}
	if s.labels != nil {
		s.labels.Attach(p)
	}
	for _, w := range s.watch {
		w.Attach(p)
	}
	for _, r := range s.rts {
		ranges, found, err := r.Attach(p)
		if !found {
			continue
		}
		if errors.Is(err, ErrProcessGone) {
			// It exited while it was read (a JVM that only runs
			// java -version): nothing was refused, and counting it
			// would make the refused metric fire on short-lived
			// processes.
			s.log.Debug("runtime process exited while attaching", zap.Int("pid", p.PID), zap.Stringer("runtime", r.Kind()))
			continue
		}
		s.mu.Lock()
		_, again := s.procs[p.PID]
		// Once per process, even one that was first seen still
		// starting (not failed yet).
		logged := s.failed[p.PID]
		if err != nil {
			s.failed[p.PID] = true
		}
		s.mu.Unlock()
		if err != nil && !logged {
			s.log.Info("runtime found but cannot be walked: native frames only",
				zap.Int("pid", p.PID), zap.Stringer("runtime", r.Kind()), zap.Error(err))
			s.mu.Lock()
			s.stats.Failed[r.Kind().String()]++
			s.mu.Unlock()
			// Ranges still go to the walker, which finds no way in: the
			// stacks keep their native frames and say runtime.
		}
		rt := unwind.Runtime{Kind: uint32(r.Kind()), Ranges: ranges}
		if len(ranges) == 0 {
			rt = unwind.Runtime{}
		}
		if err := s.unw.SetRuntime(p.PID, rt); err != nil {
			s.log.Warn("handing a runtime to the walker failed", zap.Int("pid", p.PID), zap.Error(err))
		}
		s.mu.Lock()
		if !again && len(ranges) > 0 && err == nil {
			s.stats.Attached++
		}
		s.procs[p.PID] = r
		s.mu.Unlock()
		return
	}
	// Not (or no longer, after exec) a runtime we walk.
	s.mu.Lock()
	r := s.procs[p.PID]
	delete(s.procs, p.PID)
	delete(s.failed, p.PID)
	s.mu.Unlock()
	if r != nil {
		r.Forget(p.PID)
		_ = s.unw.SetRuntime(p.PID, unwind.Runtime{})
	}
}

// Forget drops pid (it exited).
func (s *Set) Forget(pid int) {
	if s == nil {
		return
	}
	if s.labels != nil {
		s.labels.Forget(pid)
	}
	for _, w := range s.watch {
		w.Forget(pid)
	}
	s.mu.Lock()
	r := s.procs[pid]
	delete(s.procs, pid)
	delete(s.failed, pid)
	delete(s.read, pid)
	s.mu.Unlock()
	if r != nil {
		r.Forget(pid)
	}
}

// Refused reports whether pid's runtime was found but cannot be walked
// (counted in Stats().Failed), until pid is forgotten.
func (s *Set) Refused(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed[pid]
}

// SetLabeler has the Set pass process snapshots and exits to l too, and
// read sample labels through it. Call before the Set is used.
func (s *Set) SetLabeler(l Labeler) { s.labels = l }

// AddWatcher has the Set pass process snapshots and exits to w too. Call
// before the Set is used.
func (s *Set) AddWatcher(w Watcher) { s.watch = append(s.watch, w) }

// Labels returns the labels at ptr (Sample.GoLabels) in pid, nil when none.
func (s *Set) Labels(pid int, ptr uint64) []Label {
	if s == nil || s.labels == nil || ptr == 0 {
		return nil
	}
	return s.labels.Labels(pid, ptr)
}

// LabelStats returns the Labeler's counters (zero without one).
func (s *Set) LabelStats() LabelStats {
	if s == nil || s.labels == nil {
		return LabelStats{}
	}
	return s.labels.Stats()
}

// Name names one runtime frame of pid, through the runtime whose block
// its kind is in (whatever order the runtimes were given in).
func (s *Set) Name(pid int, f Frame) (Symbol, error) {
	var sym Symbol
	err := kindError(f)
	if s != nil {
		k := KindOf(f.Kind)
		for _, r := range s.rts {
			if k != KindNone && r.Kind() == k {
				sym, err = r.Name(pid, f)
				break
			}
		}
		s.mu.Lock()
		if err != nil {
			s.stats.Unnamed[Reason(err)]++
		} else {
			s.stats.Named++
		}
		s.mu.Unlock()
	}
	return sym, err
}

// Walking is how many processes the host reads from while they run: those
// running a runtime the walker takes, and the Go programs whose pprof labels
// it reads (a label set, a trace link among them, is freed once its span or
// request ends, and its memory reused).
func (s *Set) Walking() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	n := len(s.procs)
	s.mu.Unlock()
	if s.labels != nil {
		n += s.labels.Reading()
	}
	return n
}

// Stats returns a copy of the counters.
func (s *Set) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Failed = maps.Clone(st.Failed)
	st.Unnamed = maps.Clone(st.Unnamed)
	return st
}

func (k Kind) String() string {
	switch k {
	case KindHotSpot:
		return "hotspot"
	case KindCPython:
		return "cpython"
	case KindV8:
		return "v8"
	case KindPHP:
		return "php"
	case KindPerl:
		return "perl"
	case KindRuby:
		return "ruby"
	case KindNone:
		return "none"
	}
	return "runtime(" + strconv.FormatUint(uint64(k), 10) + ")"
}
