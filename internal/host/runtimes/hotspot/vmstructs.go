package hotspot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// HotSpot describes its own layout to debuggers in four tables libjvm
// exports (vmStructs.cpp): gHotSpotVMStructs (per field: type, name,
// static or not, offset or address), gHotSpotVMTypes (per type: size),
// gHotSpotVMIntConstants and gHotSpotVMLongConstants. Each table is a
// pointer to an array of entries whose stride and field offsets are
// exported too, and ends with an entry whose name is NULL. Everything here
// is read from the process, which may be hostile: every count, length and
// pointer is bounded.

// Bounds on what the tables may claim. Real JDKs have about 3,000 fields,
// 1,000 types, 1,000 constants, entries of at most 48 bytes and names of
// at most 80 bytes.
const (
	maxEntries    = 1 << 14
	maxStride     = 256
	maxTableName  = 128
	maxTableBytes = 4 << 20 // strings and entries read while parsing
)

// tableSyms are the link-time addresses (ELF virtual addresses) of the
// exported variables that describe the tables.
type tableSyms map[string]uint64

// Symbols the tables need; all are exported by every JDK since 8.
var tableSymbols = []string{
	"gHotSpotVMStructs", "gHotSpotVMStructEntryArrayStride", "gHotSpotVMStructEntryTypeNameOffset",
	"gHotSpotVMStructEntryFieldNameOffset", "gHotSpotVMStructEntryIsStaticOffset",
	"gHotSpotVMStructEntryOffsetOffset", "gHotSpotVMStructEntryAddressOffset",
	"gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride", "gHotSpotVMTypeEntryTypeNameOffset",
	"gHotSpotVMTypeEntrySizeOffset",
	"gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntryArrayStride",
	"gHotSpotVMIntConstantEntryNameOffset", "gHotSpotVMIntConstantEntryValueOffset",
	"gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntryArrayStride",
	"gHotSpotVMLongConstantEntryNameOffset", "gHotSpotVMLongConstantEntryValueOffset",
}

// optionalSymbols are read when there: the column of a field's C type,
// which gives its width (fields narrowed from int to int16_t in JDK 23).
var optionalSymbols = []string{"gHotSpotVMStructEntryTypeStringOffset"}

// field is one gHotSpotVMStructs entry: an offset in its type, or the
// run-time address of a static.
type field struct {
	static bool
	value  uint64 // offset, or address
	width  uint8  // bytes, from the C type; 0 when unknown
}

// typeWidth is the width of a field of C type typ, 0 when not a plain
// integer or pointer.
func typeWidth(typ string) uint8 {
	switch typ {
	case "u1", "uint8_t", "int8_t", "jbyte", "jubyte", "bool", "char", "signed char", "unsigned char", "CodeBlobKind":
		return 1
	case "u2", "uint16_t", "int16_t", "jshort", "jushort", "short", "unsigned short":
		return 2
	case "u4", "uint32_t", "int32_t", "jint", "juint", "int", "unsigned int", "unsigned", "uint":
		return 4
	case "u8", "uint64_t", "int64_t", "jlong", "julong", "intptr_t", "uintptr_t", "intx", "uintx", "size_t", "address":
		return 8
	}
	if strings.HasSuffix(typ, "*") {
		return 8
	}
	return 0
}

// tables is what the parse kept: only the names layout asks for (and the
// StubRoutines statics, which name stubs).
type tables struct {
	fields map[string]field  // "Type::_field"
	types  map[string]uint64 // type -> size
	ints   map[string]int64  // "Class::name" or "name"
	longs  map[string]uint64
}

// reader reads process memory.
type reader interface {
	Read(addr uint64, p []byte) error
}

// errLayout marks a layout that fails a check: the process runs HotSpot
// but profsym cannot walk it.
var errLayout = errors.New("unusable HotSpot layout")

func layoutErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errLayout}, args...)...)
}

// tableReader reads the tables through a small page cache: their strings
// sit together in libjvm's read-only data, so a parse costs tens of reads
// instead of thousands. It also counts the bytes a parse reads.
type tableReader struct {
	r     reader
	pages map[uint64][]byte
	read  int
}

const pageSize = 4096

func (t *tableReader) page(addr uint64) ([]byte, error) {
	base := addr &^ (pageSize - 1)
	if p, ok := t.pages[base]; ok {
		return p, nil
	}
	if t.read += pageSize; t.read > maxTableBytes {
		return nil, layoutErr("tables larger than %d bytes", maxTableBytes)
	}
	p := make([]byte, pageSize)
	if err := t.r.Read(base, p); err != nil {
		return nil, err
	}
	if len(t.pages) >= 256 {
		clear(t.pages)
	}
	t.pages[base] = p
	return p, nil
}

func (t *tableReader) bytes(addr uint64, p []byte) error {
	for len(p) > 0 {
		pg, err := t.page(addr)
		if err != nil {
			return err
		}
		n := copy(p, pg[addr%pageSize:])
		p, addr = p[n:], addr+uint64(n)
	}
	return nil
}

func (t *tableReader) u64(addr uint64) (uint64, error) {
	var b [8]byte
	err := t.bytes(addr, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// cstring reads a NUL-terminated name of at most maxTableName bytes.
func (t *tableReader) cstring(addr uint64) (string, error) {
	var sb strings.Builder
	for sb.Len() < maxTableName {
		pg, err := t.page(addr)
		if err != nil {
			return "", err
		}
		rest := pg[addr%pageSize:]
		if i := strings.IndexByte(string(rest), 0); i >= 0 {
			sb.Write(rest[:i])
			if sb.Len() > maxTableName {
				break
			}
			return sb.String(), nil
		}
		sb.Write(rest)
		addr += uint64(len(rest))
	}
	return "", layoutErr("name at %#x longer than %d bytes", addr, maxTableName)
}

// tableDesc says where one table's entries and their fields are.
type tableDesc struct {
	base, stride uint64
	offs         []uint64 // per column: offset in an entry
}

// describe reads a table's pointer and layout variables (run-time
// addresses: syms plus bias).
func (t *tableReader) describe(syms tableSyms, bias uint64, ptr, stride string, cols ...string) (tableDesc, error) {
	var d tableDesc
	var err error
	addr := func(name string) (uint64, error) {
		v, ok := syms[name]
		if !ok {
			return 0, layoutErr("no symbol %s", name)
		}
		return v + bias, nil
	}
	a, err := addr(ptr)
	if err != nil {
		return d, err
	}
	if d.base, err = t.u64(a); err != nil {
		return d, err
	}
	if a, err = addr(stride); err != nil {
		return d, err
	}
	if d.stride, err = t.u64(a); err != nil {
		return d, err
	}
	// libjvm's static constructors set the stride last (vmStructs.cpp):
	// a process caught while it loads libjvm has none yet.
	if d.base == 0 || d.stride == 0 {
		return d, fmt.Errorf("%s not set: %w", stride, errNotReady)
	}
	if d.stride < 16 || d.stride > maxStride || d.stride%8 != 0 {
		return d, layoutErr("%s at %#x, stride %d", ptr, d.base, d.stride)
	}
	for _, c := range cols {
		if a, err = addr(c); err != nil {
			return d, err
		}
		off, err := t.u64(a)
		if err != nil {
			return d, err
		}
		if off > d.stride-8 {
			return d, layoutErr("%s = %d past the stride %d", c, off, d.stride)
		}
		d.offs = append(d.offs, off)
	}
	return d, nil
}

// each calls fn with every entry of d up to the one whose first column
// (a name pointer) is NULL.
func (t *tableReader) each(d tableDesc, fn func(e []byte) error) error {
	e := make([]byte, d.stride)
	for i := uint64(0); i < maxEntries; i++ {
		addr := d.base + i*d.stride
		if addr < d.base {
			return layoutErr("table at %#x wraps", d.base)
		}
		if err := t.bytes(addr, e); err != nil {
			return err
		}
		if binary.LittleEndian.Uint64(e[d.offs[0]:]) == 0 {
			return nil
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return layoutErr("table at %#x has no end within %d entries", d.base, maxEntries)
}

// readTables parses the four tables, keeping the fields and sizes of the
// types in want and their constants (everything when want is nil).
func readTables(r reader, syms tableSyms, bias uint64, want map[string]bool) (*tables, error) {
	t := &tableReader{r: r, pages: map[uint64][]byte{}}
	out := &tables{fields: map[string]field{}, types: map[string]uint64{}, ints: map[string]int64{}, longs: map[string]uint64{}}
	u64 := func(e []byte, off uint64) uint64 { return binary.LittleEndian.Uint64(e[off:]) }

	d, err := t.describe(syms, bias, "gHotSpotVMStructs", "gHotSpotVMStructEntryArrayStride",
		"gHotSpotVMStructEntryTypeNameOffset", "gHotSpotVMStructEntryFieldNameOffset",
		"gHotSpotVMStructEntryIsStaticOffset", "gHotSpotVMStructEntryOffsetOffset",
		"gHotSpotVMStructEntryAddressOffset")
	if err != nil {
		return nil, err
	}
	typeCol := -1
	if a, ok := syms["gHotSpotVMStructEntryTypeStringOffset"]; ok {
		off, err := t.u64(a + bias)
		if err != nil {
			return nil, err
		}
		if off > d.stride-8 {
			return nil, layoutErr("type string column %d past the stride %d", off, d.stride)
		}
		typeCol = int(off)
	}
	err = t.each(d, func(e []byte) error {
		typ, err := t.cstring(u64(e, d.offs[0]))
		if err != nil || (want != nil && !want[typ]) {
			return err
		}
		name, err := t.cstring(u64(e, d.offs[1]))
		if err != nil {
			return err
		}
		f := field{static: binary.LittleEndian.Uint32(e[d.offs[2]:]) != 0, value: u64(e, d.offs[3])}
		if f.static {
			f.value = u64(e, d.offs[4])
		}
		if typeCol >= 0 {
			if p := u64(e, uint64(typeCol)); p != 0 {
				ts, err := t.cstring(p)
				if err != nil {
					return err
				}
				f.width = typeWidth(ts)
			}
		}
		out.fields[typ+"::"+name] = f
		return nil
	})
	if err != nil {
		return nil, err
	}

	d, err = t.describe(syms, bias, "gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride",
		"gHotSpotVMTypeEntryTypeNameOffset", "gHotSpotVMTypeEntrySizeOffset")
	if err != nil {
		return nil, err
	}
	err = t.each(d, func(e []byte) error {
		typ, err := t.cstring(u64(e, d.offs[0]))
		if err == nil && (want == nil || want[typ]) {
			out.types[typ] = u64(e, d.offs[1])
		}
		return err
	})
	if err != nil {
		return nil, err
	}

	d, err = t.describe(syms, bias, "gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntryArrayStride",
		"gHotSpotVMIntConstantEntryNameOffset", "gHotSpotVMIntConstantEntryValueOffset")
	if err != nil {
		return nil, err
	}
	err = t.each(d, func(e []byte) error {
		name, err := t.cstring(u64(e, d.offs[0]))
		if err == nil && wantConstant(name, want) {
			out.ints[name] = int64(int32(binary.LittleEndian.Uint32(e[d.offs[1]:])))
		}
		return err
	})
	if err != nil {
		return nil, err
	}

	d, err = t.describe(syms, bias, "gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntryArrayStride",
		"gHotSpotVMLongConstantEntryNameOffset", "gHotSpotVMLongConstantEntryValueOffset")
	if err != nil {
		return nil, err
	}
	err = t.each(d, func(e []byte) error {
		name, err := t.cstring(u64(e, d.offs[0]))
		if err == nil && wantConstant(name, want) {
			out.longs[name] = u64(e, d.offs[1])
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// wantConstant keeps the constants of the wanted classes (and the few
// without a class).
func wantConstant(name string, want map[string]bool) bool {
	cls, _, ok := strings.Cut(name, "::")
	return want == nil || !ok || want[cls]
}
