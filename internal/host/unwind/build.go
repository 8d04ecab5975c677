//go:build linux

package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/unwind/table"
)

var errE2BIG = unix.E2BIG

// Two builders take queued files, tables a sample waits for first, then
// the cheapest (least unwind information): the second only takes cheap
// ones, so that a new program's binary never waits behind a large library's
// build. Builds run off the sampling path and never hold the Manager's lock.
const fastLaneCost = 256 << 10

func (m *Manager) worker(maxCost int64) {
	defer m.workers.Done()
	for {
		m.mu.Lock()
		var f *file
		for f == nil {
			if m.closed {
				m.mu.Unlock()
				return
			}
			// Tables samples wait for first, then the smallest file.
			i := -1
			for j, g := range m.queue {
				if g.cost > maxCost {
					continue
				}
				if i < 0 || g.wanted && !m.queue[i].wanted ||
					g.wanted == m.queue[i].wanted && g.cost < m.queue[i].cost {
					i = j
				}
			}
			if i < 0 {
				m.cond.Wait()
				continue
			}
			f = m.queue[i]
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
		}
		f.queued, f.building = false, true
		opens := append([]string(nil), f.opens...)
		m.mu.Unlock()

		began := time.Now()
		enc, err := buildFile(f, opens)
		m.install(f, enc, err, time.Since(began))
	}
}

// buildFile opens the file by one of its paths, checks it is the version
// the processes map, and builds and encodes its table.
func buildFile(f *file, opens []string) (encoded, error) {
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
		t, err := table.Build(ef, table.Options{MaxRows: MaxRowsPerTable})
		ef.Close()
		if err != nil {
			return encoded{}, err
		}
		return encode(t), nil
	}
	return encoded{}, lastErr
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
	if buildErr != nil || len(enc.rows) == 0 {
		m.stats.BuildFailures++
		m.setState(f, stateNone)
		m.log.Debug("no unwind table: frame pointers", zap.String("file", f.path), zap.Error(buildErr))
		if f.refs == 0 {
			m.retire(f)
		}
		m.mu.Unlock()
		return
	}
	n := uint32(len(enc.rows))
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
		m.stats.NoRoom++
		f.noRoom = true
		m.setState(f, stateNone)
		if f.refs == 0 {
			m.retire(f)
		}
		m.log.Info("unwind tables full: frame pointers for this file (raise unwinding.max_table_bytes)",
			zap.String("file", f.path), zap.Int("rows", len(enc.rows)))
		m.mu.Unlock()
		return
	}
	m.mu.Unlock() // f.building stays set while the rows are written

	werr := m.writeRows(sp, enc.rows)
	base, fallbacks := enc.base, enc.fallbacks
	if f.id.Size > 16<<20 {
		// A big file's build leaves tens of MB of garbage; give it back
		// now rather than let the agent's RSS sit at its peak.
		enc = encoded{}
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
	f.rows, f.base = sp, base
	f.state = stateReady
	m.publish(f)
	if f.refs == 0 && f.lru == nil {
		f.lru = m.idle.PushBack(f)
	}
	m.log.Debug("unwind table loaded", zap.String("file", f.path), zap.Uint32("rows", n),
		zap.Int("fallback_rows", fallbacks), zap.Duration("took", took))
}

// writeRows copies rows into their span of the mmapable rows map. Only the
// span's pages are mapped, and only while writing, so the rows never count
// in the agent's RSS. The Tables.Put that publishes them is a syscall, which
// orders these stores before any program can use the rows.
func (m *Manager) writeRows(sp span, rows []bpf.ProfileUnwindRow) error {
	page := uint64(unix.Getpagesize())
	lo := uint64(sp.off) * RowBytes
	hi := lo + uint64(len(rows))*RowBytes
	start := lo &^ (page - 1)
	mem, err := unix.Mmap(m.maps.Rows.FD(), int64(start), int((hi-start+page-1)&^(page-1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("unwind: mapping the rows: %w", err)
	}
	dst := mem[lo-start:]
	for i, r := range rows {
		b := dst[i*RowBytes : i*RowBytes+RowBytes]
		binary.NativeEndian.PutUint32(b, r.Pc)
		binary.NativeEndian.PutUint16(b[4:], r.CfaOff)
		b[6] = r.Info
		b[7] = byte(r.FpOff)
	}
	return unix.Munmap(mem)
}

func (m *Manager) setState(f *file, state uint32) {
	f.state = state
	if f.slot != noRoomSlot {
		_ = m.maps.Tables.Put(f.slot, bpf.ProfileUnwindTable{State: state})
	}
}
