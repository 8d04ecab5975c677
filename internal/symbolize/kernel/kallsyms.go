// Package kernel names kernel frames: it parses /proc/kallsyms into a
// compact sorted table, reads the running kernel's and its modules' build
// ids from sysfs, and keeps the table fresh as modules come and go.
package kernel

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/profsym/profsym/internal/frame"
)

// Bounds on untrusted kallsyms text. KSYM_NAME_LEN is 512 since Linux 6.1
// and a module name is at most 56 bytes, so a real line is well under 1 KiB.
// A distribution kernel with every module loaded lists about a million
// symbols in some 50 MiB of text.
const (
	MaxLineLen  = 1024
	MaxSymbols  = 4 << 20
	MaxModules  = 1 << 15
	MaxFileSize = 256 << 20
	// MaxSymbolSize caps how far a symbol extends when nothing follows it
	// closely (the last symbol of a module, or before a gap), so an address
	// far past any function does not get a name.
	MaxSymbolSize = 1 << 20
)

var errCorrupt = fmt.Errorf("kallsyms: %w", frame.ErrCorruptFile)

// ErrAddressesHidden is returned when every address in kallsyms reads as
// zero: the kernel hides them from readers without CAP_SYSLOG when
// kernel.kptr_restrict is 1 (or from everyone when it is 2). It wraps
// frame.ErrNoDebugInfo so frames left unnamed count under that reason.
var ErrAddressesHidden = fmt.Errorf("kallsyms addresses are all zero: kernel.kptr_restrict hides them (set kernel.kptr_restrict=0, or run with CAP_SYSLOG): %w", frame.ErrNoDebugInfo)

// Table is a sorted, immutable map from kernel text addresses to symbol
// names. It is safe for concurrent use.
type Table struct {
	// Parallel arrays, one element per symbol, sorted by start: 18 bytes a
	// symbol plus its name, instead of a struct with two string headers.
	starts  []uint64
	sizes   []uint32
	mods    []uint16 // index into modules; 0 is the core kernel ("")
	nameOff []uint32 // len(starts)+1 offsets into names
	names   string
	modules []string

	stext, etext uint64 // core kernel text, 0 when kallsyms lacks the markers
}

// entry is one kept line while parsing. Non-text symbols are kept too, as
// boundaries: a function ends no later than the next symbol of any kind.
type entry struct {
	addr    uint64
	nameOff uint32
	nameLen uint16
	mod     uint16
	rank    uint8 // which alias to keep; higher is better
	text    bool
}

// ParseKallsyms reads /proc/kallsyms text ("ADDR TYPE NAME [MODULE]" lines)
// and keeps the text symbols (types t, T, w, W). Malformed or over-long
// lines, too many symbols or more than MaxFileSize bytes return an error
// wrapping frame.ErrCorruptFile; all-zero addresses return
// ErrAddressesHidden.
func ParseKallsyms(r io.Reader) (*Table, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, MaxFileSize+1), 64<<10)
	var (
		ents     []entry
		names    []byte
		modules  = []string{""}
		modIndex = map[string]uint16{"": 0}
		total    int64
		nonzero  bool
		lines    int
		stext    uint64
		etext    uint64
	)
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("kallsyms line %d: %w", lineNo, err)
		}
		if total += int64(len(line)) + 1; total > MaxFileSize {
			return nil, fmt.Errorf("kallsyms larger than %d bytes: %w", MaxFileSize, errCorrupt)
		}
		if len(line) == 0 {
			continue
		}
		if lines++; lines > MaxSymbols {
			return nil, fmt.Errorf("kallsyms has more than %d symbols: %w", MaxSymbols, errCorrupt)
		}
		addr, typ, name, mod, ok := splitLine(line)
		if !ok {
			return nil, fmt.Errorf("kallsyms line %d %q: %w", lineNo, truncate(line), errCorrupt)
		}
		if addr != 0 {
			nonzero = true
		}
		// The core kernel's text bounds; module symbols never use these names
		// as markers.
		if len(mod) == 0 {
			switch string(name) {
			case "_stext":
				stext = addr
			case "_etext":
				etext = addr
			}
		}
		e := entry{addr: addr}
		switch {
		case len(mod) == 0 && (string(name) == "_etext" || string(name) == "_einittext"):
			// End markers name no code: kept only as a boundary, so the
			// address just past the text does not resolve to them.
		case typ == 'T':
			e.text, e.rank = true, 3
		case typ == 't':
			e.text, e.rank = true, 2
		case typ == 'W' || typ == 'w':
			e.text, e.rank = true, 1
		case typ == 'a' || typ == 'A' || typ == 'U' || typ == 'u' || typ == 'v' || typ == 'V':
			// Absolute values (per-cpu offsets, constants) and undefined
			// symbols are not locations in the kernel's address space.
			continue
		}
		if e.text {
			id, ok := modIndex[string(mod)]
			if !ok {
				if len(modules) >= MaxModules {
					return nil, fmt.Errorf("kallsyms names more than %d modules: %w", MaxModules, errCorrupt)
				}
				id = uint16(len(modules))
				m := string(mod)
				modules = append(modules, m)
				modIndex[m] = id
			}
			e.mod = id
			e.nameOff, e.nameLen = uint32(len(names)), uint16(len(name))
			names = append(grow(names, len(name)), name...)
		}
		ents = append(grow(ents, 1), e)
	}
	if len(ents) > 0 && !nonzero {
		return nil, ErrAddressesHidden
	}
	return build(ents, names, modules, stext, etext), nil
}

// grow doubles a slice's capacity when n more elements do not fit. append
// grows large slices by only 1.25x, which for a table built in one pass
// allocates about five times its final size in discarded copies.
func grow[S ~[]E, E any](s S, n int) S {
	if len(s)+n <= cap(s) {
		return s
	}
	return slices.Grow(s, max(n, cap(s), 1024))
}

// build sorts the entries, picks one name per address and computes each
// symbol's extent, then copies names into one exactly sized string.
func build(ents []entry, names []byte, modules []string, stext, etext uint64) *Table {
	slices.SortStableFunc(ents, func(a, b entry) int { return cmp.Compare(a.addr, b.addr) })
	t := &Table{modules: modules, stext: stext, etext: etext}
	if etext <= stext {
		t.stext, t.etext = 0, 0
	}
	// Count the kept symbols first so the arrays are allocated exactly.
	n, nameBytes := 0, 0
	for i := 0; i < len(ents); {
		j, best := aliasGroup(ents, names, i)
		if best >= 0 {
			n++
			nameBytes += int(ents[best].nameLen)
		}
		i = j
	}
	t.starts = make([]uint64, 0, n)
	t.sizes = make([]uint32, 0, n)
	t.mods = make([]uint16, 0, n)
	t.nameOff = make([]uint32, 0, n+1)
	buf := make([]byte, 0, nameBytes)
	for i := 0; i < len(ents); {
		j, best := aliasGroup(ents, names, i)
		if best >= 0 {
			e := ents[best]
			end := e.addr + MaxSymbolSize
			if end < e.addr { // wrapped past the top of the address space
				end = ^uint64(0)
			}
			if j < len(ents) && ents[j].addr < end {
				end = ents[j].addr
			}
			// A core kernel function never runs past _etext, whatever comes
			// next (init text, or the module area far above).
			if e.mod == 0 && e.addr >= t.stext && e.addr < t.etext && end > t.etext {
				end = t.etext
			}
			t.starts = append(t.starts, e.addr)
			t.sizes = append(t.sizes, uint32(end-e.addr))
			t.mods = append(t.mods, e.mod)
			t.nameOff = append(t.nameOff, uint32(len(buf)))
			buf = append(buf, names[e.nameOff:e.nameOff+uint32(e.nameLen)]...)
		}
		i = j
	}
	t.nameOff = append(t.nameOff, uint32(len(buf)))
	t.names = string(buf)
	return t
}

// aliasGroup returns the end of the run of entries sharing ents[i].addr and
// the index of the text symbol to name that address by, or -1 when none of
// them is text. Like other symbolizers, it prefers a global symbol to a
// local one and either to a weak one, then fewer leading underscores (so
// "vfs_read" wins over "__pfx_vfs_read"-style aliases and "_stext"), then
// the longer name.
func aliasGroup(ents []entry, names []byte, i int) (end, best int) {
	best = -1
	j := i
	for ; j < len(ents) && ents[j].addr == ents[i].addr; j++ {
		e := ents[j]
		if !e.text {
			continue
		}
		if best < 0 || better(e, ents[best], names) {
			best = j
		}
	}
	return j, best
}

func better(a, b entry, names []byte) bool {
	if a.rank != b.rank {
		return a.rank > b.rank
	}
	an := names[a.nameOff : a.nameOff+uint32(a.nameLen)]
	bn := names[b.nameOff : b.nameOff+uint32(b.nameLen)]
	ua, ub := leadingUnderscores(an), leadingUnderscores(bn)
	if ua != ub {
		return ua < ub
	}
	return len(an) > len(bn)
}

func leadingUnderscores(b []byte) int {
	n := 0
	for n < len(b) && b[n] == '_' {
		n++
	}
	return n
}

// splitLine parses "ADDR TYPE NAME" with an optional "\t[MODULE]".
func splitLine(line []byte) (addr uint64, typ byte, name, mod []byte, ok bool) {
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || sp > 16 {
		return 0, 0, nil, nil, false
	}
	for _, c := range line[:sp] {
		v, ok := hexVal(c)
		if !ok {
			return 0, 0, nil, nil, false
		}
		addr = addr<<4 | uint64(v)
	}
	rest := line[sp+1:]
	if len(rest) < 3 || rest[1] != ' ' {
		return 0, 0, nil, nil, false
	}
	typ = rest[0]
	rest = rest[2:]
	if tab := bytes.IndexByte(rest, '\t'); tab >= 0 {
		name, mod = rest[:tab], bytes.TrimSpace(rest[tab+1:])
		if len(mod) < 2 || mod[0] != '[' || mod[len(mod)-1] != ']' {
			return 0, 0, nil, nil, false
		}
		mod = mod[1 : len(mod)-1]
	} else {
		name = bytes.TrimRight(rest, " \r")
	}
	if len(name) == 0 || len(name) > MaxLineLen || bytes.IndexAny(name, " \t") >= 0 {
		return 0, 0, nil, nil, false
	}
	return addr, typ, name, mod, true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// readLine returns the next line without its newline, refusing lines longer
// than MaxLineLen without buffering them.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case err == nil:
		line = line[:len(line)-1]
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("line longer than %d bytes: %w", MaxLineLen, errCorrupt)
	case err == io.EOF && len(line) > 0:
	default:
		return nil, err
	}
	if len(line) > MaxLineLen {
		return nil, fmt.Errorf("line longer than %d bytes: %w", MaxLineLen, errCorrupt)
	}
	return line, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// Lookup returns the symbol containing addr: its name, its module ("" for
// the core kernel) and its start address. It does not allocate.
func (t *Table) Lookup(addr uint64) (name, module string, start uint64, ok bool) {
	// Find the last start <= addr by hand: sort.Search's closure is not
	// guaranteed to stay off the heap.
	lo, hi := 0, len(t.starts)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.starts[m] <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 || addr-t.starts[i] >= uint64(t.sizes[i]) {
		return "", "", 0, false
	}
	return t.names[t.nameOff[i]:t.nameOff[i+1]], t.modules[t.mods[i]], t.starts[i], true
}

// Len returns the number of symbols in the table.
func (t *Table) Len() int { return len(t.starts) }

// Modules returns the module names the table saw, without the core kernel.
func (t *Table) Modules() []string { return slices.Clone(t.modules[1:]) }

// CoreText returns the core kernel's text range [_stext, _etext), or zeros
// when kallsyms did not list both markers.
func (t *Table) CoreText() (start, end uint64) { return t.stext, t.etext }

// inCoreText reports whether addr lies in the core kernel's text, where a
// miss cannot be cured by rereading kallsyms.
func (t *Table) inCoreText(addr uint64) bool {
	return t.etext > t.stext && addr >= t.stext && addr < t.etext
}
