// Package contain keeps a panic in a parser of untrusted bytes (ELF, DWARF,
// symbol tables, a download's build id) to the one file that caused it: the
// file reads as corrupt and everything else flows on. Fuzz targets switch
// containment off, so that there a panic is a crash the fuzzer reports: a
// bug of ours, not a corrupt file.
//
// A contained panic is still a bug, so it is not silent: Count says how many
// there were in the process (for a component's telemetry), and the stack of
// the first panic from each distinct site goes to the loggers that Watch
// registered, once.
package contain

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// maxSites bounds the distinct panic sites remembered. Past it, panics are
// still counted, but a new site's stack is not logged: a parser that panics
// from hundreds of places has been reported many times over already.
const maxSites = 64

// The state is the process's, as a panic is: parsers run below every
// component and carry no logger of their own.
var (
	// off counts the fuzz targets running in this process with containment off.
	off atomic.Int32
	// count is every panic contained in this process.
	count atomic.Int64

	mu       sync.Mutex
	sites    = map[string]*site{} // by the function and line that panicked
	watchers = map[int]*zap.Logger{}
	nextID   int
)

// site is where panics came from: the first one's value and stack, kept
// until a watcher has logged them.
type site struct {
	value  string
	stack  []byte
	logged bool
}

// Panic, deferred directly by a parser (defer contain.Panic(func(r any) {
// ... })), recovers a panic and hands its value to handle, which sets the
// parser's results (an error wrapping frame.ErrCorruptFile). The panic is
// counted, and its stack logged if it is its site's first. While a fuzz
// target has called Off, it recovers nothing.
func Panic(handle func(r any)) {
	if off.Load() > 0 {
		return
	}
	if r := recover(); r != nil {
		note(r)
		handle(r)
	}
}

// note counts a recovered panic and logs the stack of its site's first.
// Called from the deferred function, the stack still holds the frames of
// the panic.
func note(r any) {
	count.Add(1)
	key := panicSite()
	mu.Lock()
	defer mu.Unlock()
	if _, seen := sites[key]; seen || len(sites) >= maxSites {
		return
	}
	s := &site{value: fmt.Sprint(r), stack: debug.Stack()}
	sites[key] = s
	for _, log := range watchers {
		logSite(log, key, s)
	}
}

// panicSite is the function, file and line the panic was raised in: the
// first frame below the runtime's panic machinery.
func panicSite() string {
	var pcs [32]uintptr
	n := runtime.Callers(3, pcs[:]) // runtime.Callers, panicSite, note
	frames := runtime.CallersFrames(pcs[:n])
	inPanic := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			inPanic = true
		case inPanic && !strings.HasPrefix(f.Function, "runtime."):
			return fmt.Sprintf("%s %s:%d", f.Function, f.File, f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

func logSite(log *zap.Logger, key string, s *site) {
	s.logged = true
	log.Error("contained a panic in a parser (a bug: please report it); the file reads as corrupt",
		zap.String("site", key), zap.String("panic", s.value), zap.ByteString("stack", s.stack))
}

// Count is how many panics were contained in this process.
func Count() int64 { return count.Load() }

// Watch sends to log the stack of each distinct site's first panic: those
// seen before no watcher had logged them, then new ones as they come. A
// site is logged once, to the watchers registered when it is; stop
// unregisters log.
func Watch(log *zap.Logger) (stop func()) {
	mu.Lock()
	defer mu.Unlock()
	id := nextID
	nextID++
	watchers[id] = log
	for key, s := range sites {
		if !s.logged {
			logSite(log, key, s)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			delete(watchers, id)
			mu.Unlock()
		})
	}
}

// Off lets panics through until the returned function is called. Fuzz
// targets call it first: f.Cleanup(contain.Off()).
func Off() (restore func()) {
	off.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			off.Add(-1)
		}
	}
}
