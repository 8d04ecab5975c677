package golabels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/internal/host/runtimes"
)

// Label is one pprof label of a sample.
type Label = runtimes.Label

// Reader reads a process's memory; runtimes.Mem is one.
type Reader interface {
	Read(addr uint64, p []byte) error
}

// Limits bound what one label set costs to read.
type Limits struct {
	MaxLabels int // labels kept per set; the rest are dropped
	MaxBytes  int // each key and value is cut to this many bytes
}

var (
	// ErrUnsupported: a Go release or architecture whose layout is unknown.
	ErrUnsupported = errors.New("unsupported")
	// errBadSet: what the pointer leads to is no label set.
	errBadSet = errors.New("bad_label_set")
)

// Bounds on a forged set: how far reading one goes before it gives up.
const (
	maxBucketLog = 8    // 256 buckets: far above any label set
	maxOverflow  = 64   // overflow buckets followed per bucket chain
	maxBuckets   = 512  // bucket reads per set, overflow included
	maxCells     = 256  // occupied cells looked at per set (duplicates included)
	maxSliceLen  = 4096 // elements of a labels slice looked at
	maxStringLen = 1 << 20
)

var le = binary.LittleEndian

func u64(b []byte, off int) uint64 { return le.Uint64(b[off:]) }

// readString reads a Go string header's bytes, cut at lim.MaxBytes.
func readString(r Reader, ptr, n uint64, lim Limits) (string, error) {
	if n > maxStringLen {
		return "", fmt.Errorf("string of %d bytes: %w", n, errBadSet)
	}
	if n == 0 {
		return "", nil
	}
	n = min(n, uint64(lim.MaxBytes))
	b := make([]byte, n)
	if err := r.Read(ptr, b); err != nil {
		return "", err
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	for len(s) > lim.MaxBytes { // a replacement is longer than what it replaced
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s, nil
}

// Read reads the label set at ptr, runtime.g.labels of a goroutine of a
// process whose layout is l, sorted by key. ptr and everything it leads to
// are the process's: every pointer and length is checked, every loop
// bounded.
func Read(r Reader, ptr uint64, l Layout, lim Limits) ([]Label, error) {
	if ptr == 0 {
		return nil, nil
	}
	lim.MaxLabels = max(lim.MaxLabels, 1)
	lim.MaxBytes = max(lim.MaxBytes, 1)
	var (
		out []Label
		err error
	)
	if l.Slice {
		out, err = readSlice(r, ptr, lim)
	} else {
		out, err = readMap(r, ptr, lim)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// readSlice: labelMap{Set{List []Label}}, Label{Key, Value string}.
func readSlice(r Reader, ptr uint64, lim Limits) ([]Label, error) {
	var hdr [24]byte
	if err := r.Read(ptr, hdr[:]); err != nil {
		return nil, err
	}
	data, n := u64(hdr[:], 0), u64(hdr[:], 8)
	if n > maxSliceLen {
		return nil, fmt.Errorf("labels slice of %d: %w", n, errBadSet)
	}
	n = min(n, uint64(lim.MaxLabels))
	if n == 0 {
		return nil, nil
	}
	elems := make([]byte, 32*n)
	if err := r.Read(data, elems); err != nil {
		return nil, err
	}
	out := make([]Label, 0, n)
	for i := range n {
		e := elems[32*i:]
		k, err := readString(r, u64(e, 0), u64(e, 8), lim)
		if err != nil {
			return nil, err
		}
		v, err := readString(r, u64(e, 16), u64(e, 24), lim)
		if err != nil {
			return nil, err
		}
		out = append(out, Label{Key: k, Value: v})
	}
	return out, nil
}

// The classic (pre-1.24) map[string]string: hmap and its buckets.
const (
	hmapSize      = 48
	hmapB         = 9
	hmapBuckets   = 16
	hmapOld       = 24
	bucketCnt     = 8
	bucketSize    = 8 + bucketCnt*16*2 + 8 // tophash, keys, values, overflow
	bucketValues  = 8 + bucketCnt*16
	bucketOverflw = bucketSize - 8
	minTopHash    = 5 // below: an empty or evacuated cell
)

// readMap: ptr points at a map[string]string variable, i.e. at an *hmap.
func readMap(r Reader, ptr uint64, lim Limits) ([]Label, error) {
	var w [8]byte
	if err := r.Read(ptr, w[:]); err != nil {
		return nil, err
	}
	h := u64(w[:], 0)
	if h == 0 {
		return nil, nil
	}
	var hdr [hmapSize]byte
	if err := r.Read(h, hdr[:]); err != nil {
		return nil, err
	}
	count := u64(hdr[:], 0)
	b := hdr[hmapB]
	if b > maxBucketLog {
		return nil, fmt.Errorf("map of 2^%d buckets: %w", b, errBadSet)
	}
	if count == 0 {
		return nil, nil
	}
	m := &mapWalk{r: r, lim: lim, seen: map[string]bool{}}
	// While the map grows, cells not yet moved are in the old buckets,
	// whose moved cells are marked (tophash below minTopHash).
	if old := u64(hdr[:], hmapOld); old != 0 && b > 0 {
		if err := m.buckets(old, 1<<(b-1)); err != nil {
			return nil, err
		}
	}
	if err := m.buckets(u64(hdr[:], hmapBuckets), 1<<b); err != nil {
		return nil, err
	}
	return m.out, nil
}

type mapWalk struct {
	r     Reader
	reads int
	cellN int
	lim   Limits
	seen  map[string]bool
	out   []Label
	buf   [bucketSize]byte
}

func (m *mapWalk) buckets(base uint64, n uint64) error {
	if base == 0 {
		return fmt.Errorf("no buckets: %w", errBadSet)
	}
	for i := range n {
		addr := base + i*bucketSize
		for range maxOverflow {
			if len(m.out) >= m.lim.MaxLabels {
				return nil
			}
			if m.reads++; m.reads > maxBuckets {
				return fmt.Errorf("over %d buckets: %w", maxBuckets, errBadSet)
			}
			if err := m.r.Read(addr, m.buf[:]); err != nil {
				return err
			}
			if err := m.cells(); err != nil {
				return err
			}
			if addr = u64(m.buf[:], bucketOverflw); addr == 0 {
				break
			}
		}
	}
	return nil
}

func (m *mapWalk) cells() error {
	for j := range bucketCnt {
		if m.buf[j] < minTopHash || len(m.out) >= m.lim.MaxLabels {
			continue
		}
		if m.cellN++; m.cellN > maxCells {
			return fmt.Errorf("over %d cells: %w", maxCells, errBadSet)
		}
		k, err := readString(m.r, u64(m.buf[:], 8+16*j), u64(m.buf[:], 16+16*j), m.lim)
		if err != nil {
			return err
		}
		if m.seen[k] {
			continue
		}
		v, err := readString(m.r, u64(m.buf[:], bucketValues+16*j), u64(m.buf[:], bucketValues+8+16*j), m.lim)
		if err != nil {
			return err
		}
		m.seen[k] = true
		m.out = append(m.out, Label{Key: k, Value: v})
	}
	return nil
}
