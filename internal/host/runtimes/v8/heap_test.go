package v8

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// fakeMem is a process memory of one region at base: reads outside fail.
type fakeMem struct {
	base uint64
	b    []byte
	hole [2]uint64 // unmapped: a read that touches [hole[0], hole[1]) fails
}

func (m *fakeMem) Read(addr uint64, p []byte) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return runtimes.ErrBadFrame
	}
	if addr < m.hole[1] && addr+uint64(len(p)) > m.hole[0] {
		return runtimes.ErrBadFrame
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

// heap forges V8 objects (the host node's layout) in a fakeMem.
type heap struct {
	m    *fakeMem
	l    layout
	next uint64
	maps map[int64]uint64
}

func hostConsts() map[string]int64 {
	// The host node's (V8 11.3, Node 20) values of the tables' constants.
	return map[string]int64{
		"v8dbg_off_fp_context": -8, "v8dbg_off_fp_function": -16, "v8dbg_off_fp_bytecode_array": -32,
		"v8dbg_off_fp_bytecode_offset": -40, "v8dbg_class_JSFunction__shared__SharedFunctionInfo": 24,
		"v8dbg_class_HeapObject__map__Map": 0, "v8dbg_class_Map__instance_type__uint16_t": 12,
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object":       16,
		"v8dbg_class_SharedFunctionInfo__function_data__Object":            8,
		"v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject": 32,
		"v8dbg_class_Script__name__Object":                                 16, "v8dbg_class_Script__source__Object": 8,
		"v8dbg_class_Script__line_ends__Object": 56, "v8dbg_class_String__length__int32_t": 12,
		"v8dbg_class_SeqOneByteString__chars__char": 16, "v8dbg_class_SeqTwoByteString__chars__char": 16,
		"v8dbg_class_ConsString__first__String": 16, "v8dbg_class_ConsString__second__String": 24,
		"v8dbg_class_SlicedString__parent__String": 16, "v8dbg_class_SlicedString__offset__SMI": 24,
		"v8dbg_class_ThinString__actual__String": 16, "v8dbg_class_ExternalString__resource__Object": 16,
		"v8dbg_class_FixedArrayBase__length__SMI": 8, "v8dbg_class_FixedArray__data__uintptr_t": 16,
		"v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject": 16,
		"v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE":   262, "v8dbg_type_Script__SCRIPT_TYPE": 167,
		"v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE": 261, "v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE": 191,
		"v8dbg_type_FixedArray__FIXED_ARRAY_TYPE": 175, "v8dbg_type_Code__CODE_TYPE": 245,
		"v8dbg_FirstNonstringType": 128, "v8dbg_StringEncodingMask": 8, "v8dbg_OneByteStringTag": 8,
		"v8dbg_StringRepresentationMask": 7, "v8dbg_SeqStringTag": 0, "v8dbg_ConsStringTag": 1,
		"v8dbg_SlicedStringTag": 3, "v8dbg_ThinStringTag": 5, "v8dbg_ExternalStringTag": 2,
		"v8dbg_class_Code__source_position_table__ByteArray": 24, "v8dbg_class_Code__deoptimization_data__FixedArray": 16,
		"v8dbg_DeoptimizationDataLiteralArrayIndex": 2, "v8dbg_DeoptimizationDataSharedFunctionInfoIndex": 6, "v8dbg_DeoptimizationDataInliningPositionsIndex": 7,
		"v8dbg_SystemPointerSize": 8, "v8dbg_SmiShiftSize": 31, "v8dbg_HeapObjectTag": 1, "v8dbg_SmiTag": 0,
	}
}

// sidConsts is hostConsts as V8 13.6 (sid's Node 24) spells and places
// them, the instance types kept (the forged heap only needs them to be
// its own).
func sidConsts() map[string]int64 {
	c := hostConsts()
	for _, k := range []string{
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object", "v8dbg_class_SharedFunctionInfo__function_data__Object",
		"v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject", "v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject",
		"v8dbg_class_Code__source_position_table__ByteArray", "v8dbg_class_Code__deoptimization_data__FixedArray",
		"v8dbg_DeoptimizationDataSharedFunctionInfoIndex",
	} {
		delete(c, k)
	}
	for k, v := range map[string]int64{
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_": 24,
		"v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_":                   40,
		"v8dbg_class_BytecodeArray__wrapper__Tagged_BytecodeWrapper_":                  16,
		"v8dbg_class_BytecodeArray__data__uintptr_t":                                   64,
		"v8dbg_scopeinfo_idx_ncontextlocals":                                           2, "v8dbg_scopeinfo_idx_first_vars": 5,
		"v8dbg_class_Code__instruction_start__Address": 40, "v8dbg_class_Code__instruction_size__int": 56,
		"v8dbg_class_Code__instruction_stream__Tagged_InstructionStream_": 32, "v8dbg_class_Code__flags__uint32_t": 52,
		"v8dbg_CodeKindBaseline": 10, "v8dbg_type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE": 193,
		"v8dbg_class_SharedFunctionInfoWrapper__shared_info__Tagged_SharedFunctionInfo_": 8,
		"v8dbg_DeoptimizationDataWrappedSharedFunctionInfoIndex":                         7,
		"v8dbg_DeoptimizationDataLiteralArrayIndex":                                      3,
		"v8dbg_DeoptimizationDataInliningPositionsIndex":                                 8,
	} {
		c[k] = v
	}
	return c
}

// npm22Consts is hostConsts as V8 12.4 (nodejs.org's Node 22) spells and
// places them: V8 13's trusted code objects, with the flags and size 4
// bytes earlier and the SFI itself in the deoptimization data.
func npm22Consts() map[string]int64 {
	c := sidConsts()
	for _, k := range []string{
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
		"v8dbg_class_SharedFunctionInfoWrapper__shared_info__Tagged_SharedFunctionInfo_",
		"v8dbg_DeoptimizationDataWrappedSharedFunctionInfoIndex",
	} {
		delete(c, k)
	}
	for k, v := range map[string]int64{
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_": 16,
		"v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_":         32,
		"v8dbg_scopeinfo_idx_first_vars":                                     3,
		"v8dbg_class_Code__flags__uint32_t":                                  48, "v8dbg_class_Code__instruction_size__int": 52,
		"v8dbg_DeoptimizationDataSharedFunctionInfoIndex": 6, "v8dbg_DeoptimizationDataLiteralArrayIndex": 2,
		"v8dbg_DeoptimizationDataInliningPositionsIndex":         7,
		"v8dbg_type_TrustedFixedArray__TRUSTED_FIXED_ARRAY_TYPE": 213,
	} {
		c[k] = v
	}
	return c
}

// bookwormConsts is hostConsts as V8 10.2 (bookworm's Node 18) has them:
// no Code or DeoptimizationData fields but a few of Code's.
func bookwormConsts() map[string]int64 {
	c := hostConsts()
	for _, k := range []string{
		"v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject", "v8dbg_class_Code__source_position_table__ByteArray",
		"v8dbg_class_Code__deoptimization_data__FixedArray", "v8dbg_DeoptimizationDataSharedFunctionInfoIndex",
		"v8dbg_DeoptimizationDataLiteralArrayIndex", "v8dbg_DeoptimizationDataInliningPositionsIndex",
	} {
		delete(c, k)
	}
	c["v8dbg_class_Code__instruction_start__uintptr_t"] = 128
	c["v8dbg_class_Code__instruction_size__int"] = 40
	c["v8dbg_class_Code__flags__uint32_t"] = 48
	c["v8dbg_class_JSFunction__code__CodeT"] = 48
	return c
}

const heapBase = 0x10000

func newHeap(t testing.TB) *heap { return newHeapOf(t, hostConsts()) }

func newHeapOf(t testing.TB, c map[string]int64) *heap {
	l, err := newLayout(c)
	if err != nil {
		t.Fatal(err)
	}
	return &heap{m: &fakeMem{base: heapBase, b: make([]byte, 1<<16)}, l: l, next: heapBase + 64, maps: map[int64]uint64{}}
}

func smiOf(v int64) uint64 { return uint64(v) << 32 }

// alloc makes an object of instance type typ and size bytes; returns it tagged.
func (h *heap) alloc(typ int64, size int) uint64 {
	mp, ok := h.maps[typ]
	if !ok {
		mp = h.raw(16) + 1
		binary.LittleEndian.PutUint16(h.m.b[mp-1-heapBase+12:], uint16(typ))
		h.maps[typ] = mp
	}
	o := h.raw(size)
	h.put(o+1, 0, mp)
	return o + 1
}

func (h *heap) raw(size int) uint64 {
	o := h.next
	h.next += uint64(size+7) &^ 7
	return o
}

func (h *heap) put(obj uint64, off int64, v uint64) {
	binary.LittleEndian.PutUint64(h.m.b[obj-1+uint64(off)-heapBase:], v)
}

func (h *heap) oneByte(s string) uint64 {
	o := h.alloc(40, 16+len(s))
	binary.LittleEndian.PutUint32(h.m.b[o-1+12-heapBase:], uint32(len(s)))
	copy(h.m.b[o-1+16-heapBase:], s)
	return o
}

func (h *heap) cons(a, b uint64, n int) uint64 {
	o := h.alloc(41, 32)
	binary.LittleEndian.PutUint32(h.m.b[o-1+12-heapBase:], uint32(n))
	h.put(o, 16, a)
	h.put(o, 24, b)
	return o
}

// function forges a SharedFunctionInfo named name (through a ScopeInfo
// with nctx context locals) in a script of src, whose bytecode maps
// offsets to the positions given.
func (h *heap) function(name string, nctx int, file, src string, spt []byte) (sfi, ba uint64) {
	first := int(h.l.scopeFirst)
	si := h.alloc(261, 8*(first+2*nctx+8))
	h.put(si, 8*h.l.scopeLocals, smiOf(int64(nctx)))
	for i := 0; i < nctx; i++ {
		h.put(si, int64(8*(first+i)), h.oneByte("local"))
	}
	h.put(si, int64(8*(first+2*nctx)), h.oneByte(name))
	script := h.alloc(167, 64)
	h.put(script, 16, h.oneByte(file))
	h.put(script, 8, h.oneByte(src))
	h.put(script, 56, smiOf(0)) // no line ends yet
	table := h.alloc(190, 16+len(spt))
	h.put(table, 8, smiOf(int64(len(spt))))
	copy(h.m.b[table-1+16-heapBase:], spt)
	ba = h.alloc(191, int(h.l.bytecodeHeader))
	h.put(ba, h.l.bytecodeSPT, table)
	sfi = h.alloc(262, 64)
	h.put(sfi, h.l.sfiName, si)
	h.put(sfi, h.l.sfiData, ba)
	h.put(sfi, h.l.sfiScript, script)
	return sfi, ba
}

// varint zigzag-codes v.
func varint(v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	var out []byte
	for u >= 0x80 {
		out = append(out, byte(u)|0x80)
		u >>= 7
	}
	return append(out, byte(u))
}

// table codes (code offset, script offset) statement entries.
func table(entries ...[2]int64) []byte {
	var out []byte
	var code, pos int64
	for _, e := range entries {
		raw := (e[1] + 1) << 1
		out = append(out, varint(e[0]-code)...)
		out = append(out, varint(raw-pos)...)
		code, pos = e[0], raw
	}
	return out
}

func TestForgedFunction(t *testing.T) {
	h := newHeap(t)
	src := "function leaf(n) {\n  let x = 0;\n  for (;;) x++;\n}\n"
	spt := table([2]int64{0, 9}, [2]int64{4, 23}, [2]int64{10, 36})
	sfi, ba := h.function("leaf", 2, "/srv/app.js", src, spt)
	r := &reader{m: h.m, l: &h.l, max: 64}
	fi, err := r.function(sfi, r.lineEnds)
	if err != nil {
		t.Fatal(err)
	}
	if fi.name != "leaf" || fi.file != "/srv/app.js" || fi.bytecode != uint32(ba) {
		t.Fatalf("got %+v", fi)
	}
	for _, c := range []struct {
		off        int64
		line, col  uint32
		noPosition bool
	}{{0, 1, 10, false}, {5, 2, 5, false}, {12, 3, 5, false}, {-1, 0, 0, true}} {
		pos := sourcePosition(fi.spt, c.off)
		if c.noPosition {
			if pos != -1 {
				t.Errorf("offset %d: position %d, want none", c.off, pos)
			}
			continue
		}
		line, col := lineCol(fi.lineEnds, pos)
		if line != c.line || col != c.col {
			t.Errorf("offset %d (position %d): %d:%d, want %d:%d", c.off, pos, line, col, c.line, c.col)
		}
	}
}

func TestForgedHostile(t *testing.T) {
	h := newHeap(t)
	r := &reader{m: h.m, l: &h.l, max: 32}
	// Not a SharedFunctionInfo (a function moved away by the GC and
	// something else there now): a reason, never a name.
	if _, err := r.function(h.oneByte("leaf"), nil); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("a string as a function: %v", err)
	}
	// Wild pointers: outside the process, untagged, a map outside.
	for _, p := range []uint64{0, 8, 1 << 40, heapBase + 1<<20 + 1} {
		if _, err := r.function(p, nil); err == nil {
			t.Errorf("function at %#x named", p)
		}
	}
	// A cons string that contains itself ends at the parts bound.
	c := h.cons(0, 0, 100)
	h.put(c, 16, c)
	h.put(c, 24, c)
	if _, err := r.str(c); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("a looping cons string: %v", err)
	}
	// A long name is cut at max.
	if s, err := r.str(h.oneByte(strings.Repeat("x", 100))); err != nil || len(s) != 32 {
		t.Errorf("a long name: %q, %v", s, err)
	}
	// A length of 2^31-1 is not read (read cut at max, the region ends).
	s := h.oneByte("abc")
	binary.LittleEndian.PutUint32(h.m.b[s-1+12-heapBase:], 1<<31-1)
	if got, err := r.str(s); err == nil && len(got) > 32 {
		t.Errorf("huge length: %d bytes", len(got))
	}
	// A context local count out of range (2^20).
	sfi, _ := h.function("f", 0, "f.js", "", nil)
	si, _ := r.word(sfi, h.l.sfiName)
	h.put(si, 24, smiOf(1<<20))
	if _, err := r.function(sfi, nil); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("2^20 context locals: %v", err)
	}
}

func TestLayoutRefusals(t *testing.T) {
	c := hostConsts()
	if _, err := newLayout(c); err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(map[string]int64){
		"missing":    func(c map[string]int64) { delete(c, "v8dbg_off_fp_function") },
		"compressed": func(c map[string]int64) { c["v8dbg_SmiShiftSize"] = 0 },
		"far slot":   func(c map[string]int64) { c["v8dbg_off_fp_bytecode_offset"] = -4096 },
		"odd slot":   func(c map[string]int64) { c["v8dbg_off_fp_context"] = -12 },
		"wild field": func(c map[string]int64) { c["v8dbg_class_Script__name__Object"] = 1 << 20 },
	} {
		c := hostConsts()
		change(c)
		if _, err := newLayout(c); !errors.Is(err, errRefused) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestHostNodeTables reads the host node's tables, as attach does.
func TestHostNodeTables(t *testing.T) {
	if _, err := os.Stat("/usr/bin/node"); err != nil {
		testfixture.SkipOrFail(t, "no /usr/bin/node: %v", err)
	}
	fi := inspectPath(t, "/usr/bin/node")
	if fi.err != nil {
		t.Fatal(fi.err)
	}
	if _, err := newLayout(fi.consts); err != nil {
		t.Fatal(err)
	}
	if fi.blobHi <= fi.blobLo {
		t.Fatalf("builtins [%#x, %#x)", fi.blobLo, fi.blobHi)
	}
	t.Logf("%d constants, builtins [%#x, %#x) at file offset %#x", len(fi.consts), fi.blobLo, fi.blobHi, fi.blobFileLo)
}

// code forges an optimized Code object of sfi whose instructions start at
// start (size bytes), with position table spt and inlined functions
// (inlining positions: SFI literal index, caller position).
func (h *heap) code(sfi uint64, start, size uint64, spt []byte, inlined []uint64, callers []int64) uint64 {
	table := h.alloc(190, 16+len(spt))
	h.put(table, 8, smiOf(int64(len(spt))))
	copy(h.m.b[table-1+16-heapBase:], spt)
	lits := h.alloc(175, 16+8*len(inlined))
	h.put(lits, 8, smiOf(int64(len(inlined))))
	for i, f := range inlined {
		h.put(lits, int64(16+8*i), f)
	}
	pos := h.alloc(190, 16+inliningPosSize*len(callers))
	h.put(pos, 8, smiOf(int64(inliningPosSize*len(callers))))
	for i, c := range callers {
		h.put(pos, int64(16+inliningPosSize*i), uint64(c))
		binary.LittleEndian.PutUint32(h.m.b[pos-1+uint64(16+inliningPosSize*i+8)-heapBase:], uint32(i))
	}
	deopt := h.alloc(h.l.typeDeopt, 16+8*10)
	h.put(deopt, 8, smiOf(10))
	h.put(deopt, 16+8*h.l.deopt.literals, lits)
	if h.l.deoptWrapped > 0 {
		w := h.alloc(195, 16)
		h.put(w, h.l.deoptWrapped, sfi)
		sfi = w
	}
	h.put(deopt, 16+8*h.l.deopt.sfi, sfi)
	h.put(deopt, 16+8*h.l.deopt.inlining, pos)
	var c uint64
	if h.l.codeInline {
		// V8 10: the instructions follow the Code object's header.
		c = start - uint64(h.l.istream) + 1
		h.alloc(245, 8) // the Code map
		h.put(c, 0, h.maps[245])
	} else {
		c = h.alloc(245, 64)
		h.put(c, codeInstrStart, start)
		// The InstructionStream header before the instructions.
		h.put(start-uint64(h.l.istream)+1, 0, h.alloc(252, 8))
		h.put(start-uint64(h.l.istream)+1, 8, c)
	}
	h.put(c, h.l.codeDeopt, deopt)
	h.put(c, h.l.codePositions, table)
	binary.LittleEndian.PutUint32(h.m.b[c-1+uint64(h.l.codeFlagsOff)-heapBase:], codeKindTurbo)
	binary.LittleEndian.PutUint32(h.m.b[c-1+uint64(h.l.codeSizeOff)-heapBase:], uint32(size))
	return c
}

// TestForgedInlined decodes an optimized frame with a function inlined,
// in V8 10's, 11's, 12.4's and 13's layouts.
func TestForgedInlined(t *testing.T) {
	t.Run("v8-11", func(t *testing.T) { forgedInlined(t, newHeap(t)) })
	t.Run("v8-10", func(t *testing.T) {
		h := newHeapOf(t, bookwormConsts())
		if !h.l.jit || h.l.bpfOpt || !h.l.codeInline {
			t.Fatalf("V8 10's code layout not taken: %+v", h.l)
		}
		forgedInlined(t, h)
	})
	t.Run("v8-13", func(t *testing.T) {
		h := newHeapOf(t, sidConsts())
		if !h.l.jit || h.l.bpfOpt || h.l.istream != 32 || h.l.deoptWrapped != 8 {
			t.Fatalf("V8 13's code layout not taken: %+v", h.l)
		}
		forgedInlined(t, h)
	})
	t.Run("v8-12.4", func(t *testing.T) {
		h := newHeapOf(t, npm22Consts())
		if !h.l.jit || h.l.bpfOpt || h.l.istream != 32 || h.l.deoptWrapped != 0 || h.l.codeSizeOff != 52 || h.l.typeDeoptAlt != 213 {
			t.Fatalf("V8 12.4's code layout not taken: %+v", h.l)
		}
		// Its deoptimization data is a TrustedFixedArray: forged so.
		h.l.typeDeopt, h.l.typeDeoptAlt = h.l.typeDeoptAlt, h.l.typeDeopt
		forgedInlined(t, h)
	})
}

func forgedInlined(t *testing.T, h *heap) {
	src := "function leaf() {\n  return 1;\n}\nfunction top() {\n  return leaf();\n}\n"
	leaf, _ := h.function("leaf", 0, "/srv/app.js", src, nil)
	top, _ := h.function("top", 0, "/srv/app.js", src, nil)
	// Offsets 0-15: top's own line 5; 16 on: leaf (inlining id 1) line 2,
	// called from top's line 5 (script offset 51).
	raw := func(off, inl int64) int64 { return (off+1)<<1 | inl<<31 }
	var spt []byte
	var code, p int64
	for _, e := range [][2]int64{{0, raw(51, 0)}, {16, raw(22, 1)}} {
		spt = append(spt, varint(e[0]-code)...)
		spt = append(spt, varint(e[1]-p)...)
		code, p = e[0], e[1]
	}
	start := uint64(heapBase + 0xc000)
	c := h.code(top, start, 64, spt, []uint64{leaf}, []int64{raw(51, 0)})
	r := &reader{m: h.m, l: &h.l, max: 64}
	info := func(sfi uint64) (*fnInfo, error) { return r.function(sfi, r.lineEnds) }
	frs, err := r.optFrames(c, 20, uint32(top), h.l.deopt, info)
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, f := range frs {
		got += fmt.Sprintf("%s:%d ", f.Name, f.Line)
	}
	if got != "leaf:2 top:5 " {
		t.Errorf("inlined frames %q, want leaf:2 top:5", got)
	}
	// Another function's code at that address (freed, reused): a reason.
	if _, err := r.optFrames(c, 20, uint32(leaf), h.l.deopt, info); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("code of another function: %v", err)
	}
	// Found from a PC inside it, not from one past it.
	if fc, fs := r.codeAt(start + 20); fc != c || fs != start {
		t.Errorf("codeAt: %#x at %#x, want %#x at %#x", fc, fs, c, start)
	}
	if fc, _ := r.codeAt(start + 200); fc != 0 {
		t.Errorf("codeAt past the code: %#x", fc)
	}
	// Code a few pages into its mapping (a worker's fresh JIT region),
	// unmapped memory below: the search's chunk reaches below the
	// mapping, and the code is found from the pages above (before, the
	// frame kept its function's name without a line).
	if next := h.next; next >= start-0x4000 {
		t.Fatalf("forged objects up to %#x, in the hole", next)
	}
	h.m.hole = [2]uint64{start - 0x4000, (start - uint64(h.l.istream)) &^ (readStep - 1)}
	if fc, fs := r.codeAt(start + 20); fc != c || fs != start {
		t.Errorf("codeAt above a hole: %#x at %#x, want %#x at %#x", fc, fs, c, start)
	}
	h.m.hole = [2]uint64{start - 0x4000, start + 0x1000}
	if fc, _ := r.codeAt(start + 20); fc != 0 {
		t.Errorf("codeAt in a hole: %#x", fc)
	}
	h.m.hole = [2]uint64{}
}

func TestBaselineOffset(t *testing.T) {
	// Bytecodes 0-3 are the prefixes; 4 is 2 bytes long (3 wide, 5 extra
	// wide), 5 is 3 (5, 9).
	sizes := []byte{1, 1, 1, 1, 2, 3, 1, 1, 1, 1, 3, 5, 1, 1, 1, 1, 5, 9}
	bytecodes := []byte{4, 0, 5, 0, 0, 0, 4, 0, 0, 5, 0, 0}
	// The prologue's machine code, then each bytecode's.
	table := []byte{10, 4, 6, 2, 8}
	for pc, want := range map[uint64]int64{5: -1, 12: 0, 14: 0, 15: 2, 21: 5, 25: 9, 31: -1} {
		if got := baselineOffset(table, bytecodes, sizes, pc); got != want {
			t.Errorf("pc offset %d: bytecode offset %d, want %d", pc, got, want)
		}
	}
}
