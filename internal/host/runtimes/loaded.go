package runtimes

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
)

// ErrNotLoaded: the loader has not finished putting a runtime's file in
// place in the process: a segment is not mapped where it belongs yet, or
// the file is not relocated. What its data segment holds then is not what
// the runtime will read (ld.so maps a library's whole span from its first
// segment before it maps the others over it, and pointers hold link-time
// addresses until relocation), so a runtime looks again later instead of
// judging the layout on it.
var ErrNotLoaded = errors.New("runtime file not loaded and relocated yet")

// maxMapsBytes bounds the /proc/PID/maps text Loaded reads.
const maxMapsBytes = 16 << 20

// Loaded checks in /proc/PID/maps that file m (one executable mapping of
// it, with its PT_LOAD and PT_GNU_RELRO headers) is in place: the first and
// last byte of each segment's file bytes are mapped from the same path at
// the offset the segment gives, and the RELRO pages, which the loader makes
// read-only once it has relocated the file, are no longer writable. A file
// without RELRO (a non-PIE static executable needs no relocation) is
// checked for its mappings only. It returns an error wrapping ErrNotLoaded
// when the process is not there yet, and frame.ErrLimitExceeded for maps
// text past maxMapsBytes.
func Loaded(procRoot string, pid int, m *normalize.Mapping) error {
	if m.File == nil || len(m.File.Loads) == 0 {
		return fmt.Errorf("%s: no program headers known: %w", m.Path, ErrNotLoaded)
	}
	v, ok := addrmap.FileOffsetToVaddr(m.File.Loads, m.Offset)
	if !ok {
		return fmt.Errorf("%s: mapping offset %#x outside its segments: %w", m.Path, m.Offset, ErrNotLoaded)
	}
	bias := m.Start - v
	if procRoot == "" {
		procRoot = "/proc"
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var maps []addrmap.Mapping
	lr := &io.LimitedReader{R: f, N: maxMapsBytes + 1}
	err = addrmap.ParseMaps(lr, func(mm addrmap.Mapping) error {
		if mm.Path == m.Path {
			maps = append(maps, mm)
		}
		return nil
	})
	if lr.N == 0 {
		return fmt.Errorf("/proc/%d/maps longer than %d bytes: %w", pid, maxMapsBytes, frame.ErrLimitExceeded)
	}
	if err != nil {
		return err
	}
	// ld.so rounds by the kernel's page size, which the agent shares
	// with the process (4 KiB on x86-64; 4, 16 or 64 KiB on arm64).
	page := uint64(os.Getpagesize())
	at := func(addr uint64) *addrmap.Mapping {
		for i := range maps {
			if maps[i].Start <= addr && addr < maps[i].End {
				return &maps[i]
			}
		}
		return nil
	}
	for _, s := range m.File.Loads {
		if s.Filesz == 0 {
			continue
		}
		for _, fo := range []uint64{s.Off, s.Off + s.Filesz - 1} {
			addr := bias + s.Vaddr + (fo - s.Off)
			mm := at(addr)
			if mm == nil || addr-mm.Start+mm.Offset != fo {
				return fmt.Errorf("%s: file offset %#x not mapped at %#x yet: %w", m.Path, fo, addr, ErrNotLoaded)
			}
		}
	}
	if r := m.File.Relro; r.Memsz > 0 {
		// The pages ld.so protects (_dl_protect_relro).
		start := (bias + r.Vaddr) &^ (page - 1)
		end := (bias + r.Vaddr + r.Memsz) &^ (page - 1)
		if start < end {
			mm := at(start)
			if mm == nil || mm.Perms&addrmap.Write != 0 {
				return fmt.Errorf("%s: not relocated yet (RELRO at %#x writable): %w", m.Path, start, ErrNotLoaded)
			}
		}
	}
	return nil
}
