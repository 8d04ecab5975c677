//go:build linux && (amd64 || arm64)

package unwind

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/unwind/table"
)

var errE2BIG = unix.E2BIG

// errUnopened: none of the file's paths opened it (the processes gone, or
// the file changed on disk since they mapped it).
var errUnopened = errors.New("unwind: no path opens the mapped file")

// freeAfterRows: a build of at least this many rows (2 MiB of them, a
// transient heap of about 5 MB) returns its memory to the OS when done.
const freeAfterRows = 256 << 10

// Builders take queued files, tables a sample waits for first, then the
// cheapest (least unwind information). At most two run: a second starts
// only while the first builds a large file, and takes only small ones, so
// that a new program's binary never waits behind a large library's build.
// Builders run only while there is work, off the sampling path, and never
// hold the Manager's lock while building.
const fastLaneCost = 256 << 10

// kick starts a builder if an eligible build has none. Called with m.mu held.
func (m *Manager) kick() {
	if m.closed {
		return
	}
	switch {
	case m.builders == 0:
		if m.next(math.MaxInt64, true) < 0 {
			return
		}
		m.startBuilder(math.MaxInt64)
	case m.builders == 1 && m.bigBuild:
		if m.next(fastLaneCost, false) < 0 {
			return
		}
		m.startBuilder(fastLaneCost)
	}
}

func (m *Manager) startBuilder(maxCost int64) {
	m.builders++
	m.workers.Add(1)
	go m.builder(maxCost)
}

// next returns the queue index of the next eligible build of at most
// maxCost, or -1; with wake set, it arranges a kick for the earliest
// speculative build that is not eligible yet.
func (m *Manager) next(maxCost int64, wake bool) int {
	i := -1
	now := time.Now()
	var later time.Time
	for j, g := range m.queue {
		if g.cost > maxCost {
			continue
		}
		if !g.wanted && g.eligible.After(now) {
			if later.IsZero() || g.eligible.Before(later) {
				later = g.eligible
			}
			continue
		}
		if i < 0 || g.wanted && !m.queue[i].wanted ||
			g.wanted == m.queue[i].wanted && g.cost < m.queue[i].cost {
			i = j
		}
	}
	if i < 0 && wake && !later.IsZero() {
		m.wakeBuilders(later)
	}
	return i
}

// builder builds queued files until none is eligible.
func (m *Manager) builder(maxCost int64) {
	defer m.workers.Done()
	m.mu.Lock()
	for !m.closed {
		i := m.next(maxCost, true)
		if i < 0 {
			break
		}
		f := m.queue[i]
		m.queue = slices.Delete(m.queue, i, i+1)
		f.queued = false
		if !f.wanted && !m.anyAlive(f) {
			// A speculative build whose processes are all gone (their exit
			// events may come later): leave the file lazy; a process that
			// maps it again, or a sample, asks for it.
			m.stats.BuildsSkipped++
			m.setLazy(f)
			continue
		}
		f.building = true
		big := f.cost > fastLaneCost
		if big {
			m.bigBuild = true
			m.kick() // small files get a builder of their own meanwhile
		}
		opens := m.opensOf(f)
		m.mu.Unlock()

		began := time.Now()
		enc, err := buildFile(f, opens, m.maxRows)
		m.install(f, enc, err, time.Since(began))

		m.mu.Lock()
		if big {
			m.bigBuild = false
		}
	}
	m.builders--
	m.mu.Unlock()
}

// buildFile opens the file by one of its paths, checks it is the version
// the processes map, and builds and encodes its table.
func buildFile(f *file, opens []string, maxRows int) (encoded, error) {
	var lastErr error = errors.New("no path to open")
	for _, p := range opens {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			lastErr = err
			continue
		}
		if st.Dev != f.id.Dev || st.Ino != f.id.Ino || st.Size != f.id.Size || st.Mtim.Nano() != f.id.Mtime {
			lastErr = fmt.Errorf("%s changed since it was mapped", p)
			continue
		}
		ef, err := elfx.Open(p)
		if err != nil {
			lastErr = err
			continue
		}
		// Rows go straight into their 8-byte encoding: the build holds
		// no table of 32-byte rows.
		enc := newEncoder(ef.Machine)
		_, err = table.Stream(ef, table.Options{MaxRows: maxRows}, enc.add)
		ef.Close()
		if err != nil {
			e := enc.finish()
			e.rows.release()
			return encoded{}, err
		}
		return enc.finish(), nil
	}
	return encoded{}, fmt.Errorf("%w: %w", errUnopened, lastErr)
}

// install loads a built table into the rows map, evicting idle tables for
// room, and flips its slot to ready. The rows are written without the lock
// (their span is reserved), so process events are not held up by a big table.
func (m *Manager) install(f *file, enc encoded, buildErr error, took time.Duration) {
	m.mu.Lock()
	f.building = false
	m.stats.BuildTime += took
	if m.closed || f.retired {
		m.mu.Unlock()
		return
	}
	defer enc.rows.release()
	if errors.Is(buildErr, frame.ErrLimitExceeded) {
		// More rows than the rows map holds: as if there were no room.
		m.noRoomLocked(f)
		m.log.Info("unwind table larger than unwinding.max_table_bytes: frame pointers for this file",
			zap.String("file", f.path), zap.Error(buildErr))
		m.mu.Unlock()
		return
	}
	if buildErr != nil || enc.rows.len() == 0 {
		m.stats.BuildFailures++
		m.setState(f, stateNone)
		f.unopened = errors.Is(buildErr, errUnopened)
		m.log.Debug("no unwind table: frame pointers", zap.String("file", f.path), zap.Error(buildErr))
		if f.refs == 0 {
			m.retire(f)
		}
		m.mu.Unlock()
		return
	}
	n := uint32(enc.rows.len())
	f.building = true // keeps the file from being retired while the lock is dropped
	sp, ok := m.rows.alloc(n)
	for !ok {
		// Evict until the released rows could hold the table, then wait
		// for one grace period for all of them.
		progressed := false
		for m.rows.pendingRows() < n && m.evictOne() {
			progressed = true
		}
		if len(m.rows.pending) > 0 {
			if err := m.reclaimUnlocked(); err != nil || m.closed || f.retired {
				break
			}
			progressed = true
		}
		if !progressed {
			break
		}
		sp, ok = m.rows.alloc(n)
	}
	if m.closed || f.retired {
		if ok {
			m.rows.release(sp)
		}
		f.building = false
		m.mu.Unlock()
		return
	}
	if !ok {
		f.building = false
		m.noRoomLocked(f)
		m.log.Info("unwind tables full: frame pointers for this file (raise unwinding.max_table_bytes)",
			zap.String("file", f.path), zap.Int("rows", enc.rows.len()))
		m.mu.Unlock()
		return
	}
	m.mu.Unlock() // f.building stays set while the rows are written

	werr := m.writeRows(sp, &enc.rows)
	index := rowIndex(&enc.rows)
	base, fallbacks := enc.base, enc.fallbacks
	enc.rows.release()
	if n >= freeAfterRows {
		// The build's heap (2-2.5 times its rows' 8 bytes) is garbage now;
		// without a collection the runtime keeps it resident until later
		// ones lower its goal (measured: libLLVM's 15 MB still there 7 s
		// after, 0 MB with this, at no measurable CPU).
		debug.FreeOSMemory()
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	f.building = false
	if werr != nil || m.closed || f.retired {
		m.rows.release(sp)
		if werr != nil {
			m.stats.BuildFailures++
			m.setState(f, stateNone)
			m.log.Warn("loading an unwind table failed", zap.String("file", f.path), zap.Error(werr))
		}
		return
	}
	m.stats.Builds++
	f.rows, f.base, f.rowIndex = sp, base, index
	f.state = stateReady
	m.publish(f)
	if len(m.copies) > 0 {
		m.tryCopies(-1, time.Time{}) // copied stacks may have waited for this table
	}
	if f.refs == 0 && f.lru == nil {
		f.lru = m.idle.PushBack(f)
	}
	m.log.Debug("unwind table loaded", zap.String("file", f.path), zap.Uint32("rows", n),
		zap.Int("fallback_rows", fallbacks), zap.Duration("took", took))
}

// writeRows copies rows into their span of the mmapable rows map, one
// chunk (128 KiB) at a time: only the chunk's pages are mapped, and only
// while writing, so the rows never count in the agent's RSS beyond one
// chunk. The Tables.Put that publishes them is a syscall, which orders
// these stores before any program can use the rows.
func (m *Manager) writeRows(sp span, rows *rowBuf) error {
	page := uint64(unix.Getpagesize())
	return rows.each(func(first int, part []bpf.ProfileUnwindRow) error {
		lo := (uint64(sp.off) + uint64(first)) * RowBytes
		hi := lo + uint64(len(part))*RowBytes
		start := lo &^ (page - 1)
		mem, err := unix.Mmap(m.maps.Rows.FD(), int64(start), int((hi-start+page-1)&^(page-1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("unwind: mapping the rows: %w", err)
		}
		putRows(mem[lo-start:], part)
		return unix.Munmap(mem)
	})
}

// noRoomLocked leaves f on frame pointers for want of room in the rows map,
// counted.
func (m *Manager) noRoomLocked(f *file) {
	m.stats.NoRoom++
	f.noRoom = true
	m.setState(f, stateNone)
	if f.refs == 0 {
		m.retire(f)
	}
}

func (m *Manager) setState(f *file, state uint32) {
	f.state = state
	if f.slot != noRoomSlot {
		_ = m.maps.Tables.Put(f.slot, bpf.ProfileUnwindTable{State: state})
	}
}
