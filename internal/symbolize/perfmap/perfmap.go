// Package perfmap names JIT-compiled code from the perf map files that JITs
// (the JVM's Compiler.perfmap command, V8's --perf-basic-prof, .NET, LuaJIT
// and others) write to /tmp/perf-PID.map.
package perfmap

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"

	"github.com/profsym/profsym/internal/frame"
)

// Bounds on untrusted map files. A JVM's map is a few thousand lines; a
// long-running node process with --perf-basic-prof appends forever and can
// reach hundreds of megabytes, which is where the size cap bites.
const (
	MaxLineLen  = 4096
	MaxEntries  = 4 << 20
	MaxFileSize = 256 << 20
)

var errCorrupt = fmt.Errorf("perf map: %w", frame.ErrCorruptFile)

// Map answers which JIT symbol covers an address. Where entries overlap
// (a JIT freed code and reused the memory), the entry written last owns the
// overlap. It is immutable and safe for concurrent use.
type Map struct {
	// Non-overlapping, sorted segments, each owned by one symbol.
	segStart, segEnd []uint64
	segSym           []uint32
	// Symbols that own at least one segment, names in one string.
	symStart []uint64
	nameOff  []uint32 // len(symStart)+1
	names    string
	skipped  int
}

// raw is one parsed line; its index is its order in the file.
type raw struct {
	start, end uint64
	nameOff    uint32
	nameLen    uint16
}

// Parse reads a perf map: lines "START SIZE NAME", START and SIZE in hex
// with or without "0x" (the JVM writes it, V8 does not), NAME the rest of
// the line and free to contain spaces. Lines that do not parse, are longer
// than MaxLineLen or have size zero are skipped and counted (Skipped), since
// one odd line should not cost every other name. A last line without a
// newline is skipped too: the JIT may be writing it right now. More than
// MaxFileSize bytes or MaxEntries entries is an error wrapping
// frame.ErrCorruptFile.
func Parse(r io.Reader) (*Map, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, MaxFileSize+1), MaxLineLen+1)
	var (
		ents    []raw
		names   []byte
		total   int64
		skipped int
	)
	for {
		line, n, complete, err := readLine(br)
		if total += int64(n); total > MaxFileSize {
			return nil, fmt.Errorf("larger than %d bytes: %w", MaxFileSize, errCorrupt)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if !complete {
			skipped++
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		start, size, name, ok := parseLine(line)
		if !ok || size == 0 || start+size < start {
			skipped++
			continue
		}
		if len(ents) >= MaxEntries {
			return nil, fmt.Errorf("more than %d entries: %w", MaxEntries, errCorrupt)
		}
		ents = append(grow(ents, 1), raw{start: start, end: start + size, nameOff: uint32(len(names)), nameLen: uint16(len(name))})
		names = append(grow(names, len(name)), name...)
	}
	m := build(ents, names)
	m.skipped = skipped
	return m, nil
}

// grow doubles a slice's capacity when n more elements do not fit, rather
// than append's 1.25x for large slices, to cut discarded copies.
func grow[S ~[]E, E any](s S, n int) S {
	if len(s)+n <= cap(s) {
		return s
	}
	return slices.Grow(s, max(n, cap(s), 256))
}

// readLine returns the next line without its newline and the bytes it
// consumed. complete is false for a line longer than MaxLineLen (consumed
// whole but not returned) and for a last line with no newline.
func readLine(br *bufio.Reader) (line []byte, n int, complete bool, err error) {
	line, err = br.ReadSlice('\n')
	n = len(line)
	switch {
	case err == nil:
		return line[:len(line)-1], n, true, nil
	case errors.Is(err, bufio.ErrBufferFull):
		for errors.Is(err, bufio.ErrBufferFull) {
			var more []byte
			more, err = br.ReadSlice('\n')
			n += len(more)
			// Stop counting past the cap; the caller fails on it anyway.
			if n > MaxFileSize {
				return nil, n, false, nil
			}
		}
		if err != nil && err != io.EOF {
			return nil, n, false, err
		}
		return nil, n, false, nil
	case err == io.EOF && len(line) > 0:
		return nil, n, false, nil
	}
	return nil, n, false, err
}

// parseLine splits "START SIZE NAME". The name keeps inner spaces; only the
// separating blanks and a trailing CR are dropped.
func parseLine(line []byte) (start, size uint64, name []byte, ok bool) {
	rest := line
	field := func() ([]byte, bool) {
		rest = bytes.TrimLeft(rest, " \t")
		i := bytes.IndexAny(rest, " \t")
		if i <= 0 {
			return nil, false
		}
		f := rest[:i]
		rest = rest[i:]
		return f, true
	}
	a, ok1 := field()
	b, ok2 := field()
	if !ok1 || !ok2 {
		return 0, 0, nil, false
	}
	start, ok1 = parseHex(a)
	size, ok2 = parseHex(b)
	name = bytes.TrimRight(bytes.TrimLeft(rest, " \t"), " \t\r")
	if !ok1 || !ok2 || len(name) == 0 {
		return 0, 0, nil, false
	}
	return start, size, name, true
}

func parseHex(b []byte) (uint64, bool) {
	if len(b) > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X') {
		b = b[2:]
	}
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | uint64(c-'0')
		case 'a' <= c && c <= 'f':
			v = v<<4 | uint64(c-'a'+10)
		case 'A' <= c && c <= 'F':
			v = v<<4 | uint64(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// build resolves overlaps with a sweep over every start and end: at each
// point the active entry with the highest file position owns the stretch up
// to the next point. That is "last writer wins" in O(n log n), however the
// entries nest or chain.
func build(ents []raw, names []byte) *Map {
	m := &Map{}
	if len(ents) == 0 {
		m.nameOff = []uint32{0}
		return m
	}
	order := make([]uint32, len(ents))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortFunc(order, func(a, b uint32) int { return cmp.Compare(ents[a].start, ents[b].start) })
	points := make([]uint64, 0, 2*len(ents))
	for _, e := range ents {
		points = append(points, e.start, e.end)
	}
	slices.Sort(points)
	points = slices.Compact(points)

	var h maxHeap
	next := 0
	owner := make([]uint32, 0, len(points))
	var segStart, segEnd []uint64
	for k := 0; k+1 < len(points); k++ {
		p := points[k]
		for next < len(order) && ents[order[next]].start <= p {
			h.push(order[next])
			next++
		}
		for len(h) > 0 && ents[h[0]].end <= p {
			h.pop()
		}
		if len(h) == 0 {
			continue
		}
		top := h[0]
		if n := len(owner); n > 0 && owner[n-1] == top && segEnd[n-1] == p {
			segEnd[n-1] = points[k+1]
			continue
		}
		owner = append(owner, top)
		segStart = append(segStart, p)
		segEnd = append(segEnd, points[k+1])
	}

	// Keep only symbols that own something, numbered in address order,
	// with their names copied into one string.
	const none = ^uint32(0)
	newID := make([]uint32, len(ents))
	for i := range newID {
		newID[i] = none
	}
	nameBytes := 0
	for _, o := range owner {
		if newID[o] == none {
			newID[o] = 0 // counted; numbered below
			nameBytes += int(ents[o].nameLen)
		}
	}
	for i := range newID {
		newID[i] = none
	}
	buf := make([]byte, 0, nameBytes)
	m.segSym = make([]uint32, len(owner))
	for i, o := range owner {
		if newID[o] == none {
			newID[o] = uint32(len(m.symStart))
			e := ents[o]
			m.symStart = append(m.symStart, e.start)
			m.nameOff = append(m.nameOff, uint32(len(buf)))
			buf = append(buf, names[e.nameOff:e.nameOff+uint32(e.nameLen)]...)
		}
		m.segSym[i] = newID[o]
	}
	m.nameOff = append(m.nameOff, uint32(len(buf)))
	m.names = string(buf)
	m.symStart = slices.Clip(m.symStart)
	m.segStart = slices.Clip(segStart)
	m.segEnd = slices.Clip(segEnd)
	return m
}

// maxHeap holds entry indices; the largest (latest written) is on top.
type maxHeap []uint32

func (h *maxHeap) push(v uint32) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p] >= s[i] {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *maxHeap) pop() {
	s := *h
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, r, big := 2*i+1, 2*i+2, i
		if l < n && s[l] > s[big] {
			big = l
		}
		if r < n && s[r] > s[big] {
			big = r
		}
		if big == i {
			break
		}
		s[i], s[big] = s[big], s[i]
		i = big
	}
	*h = s
}

// Lookup returns the symbol covering addr and that symbol's start address
// as the map file gave it (even when a later entry took over its first
// bytes). It does not allocate.
func (m *Map) Lookup(addr uint64) (name string, start uint64, ok bool) {
	lo, hi := 0, len(m.segStart)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if m.segStart[mid] <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	i := lo - 1
	if i < 0 || addr >= m.segEnd[i] {
		return "", 0, false
	}
	s := m.segSym[i]
	return m.names[m.nameOff[s]:m.nameOff[s+1]], m.symStart[s], true
}

// Len returns how many symbols own part of the address space.
func (m *Map) Len() int { return len(m.symStart) }

// Skipped returns how many lines Parse skipped as malformed, over-long,
// empty-sized or unfinished.
func (m *Map) Skipped() int { return m.skipped }

// Symbols yields each symbol's start and name, in the address order of the
// first stretch it owns.
func (m *Map) Symbols() iter.Seq2[uint64, string] {
	return func(yield func(uint64, string) bool) {
		for i, start := range m.symStart {
			if !yield(start, m.names[m.nameOff[i]:m.nameOff[i+1]]) {
				return
			}
		}
	}
}
