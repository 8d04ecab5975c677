package hotspot

import (
	"runtime"
	"strings"

	"github.com/profsym/profsym/internal/elfx"
)

// Versions walked: JDK 8 to 27, whose layouts differ where their tables
// say so (layout.go's newLayout); a newer one is refused until tested.
const (
	minVersion = 8
	maxVersion = 27
)

// Where a JDK keeps an nmethod's debug information.
const (
	// 8-22: metadata, scopes data and PcDescs one after the other in the
	// nmethod (9-22: scopes data through a pointer).
	nmInBlob = iota
	// 23+: PcDescs and scopes data in immutable data on the C heap;
	// metadata in the blob's data (23, 24) or its mutable data (25+).
	nmImmutable
)

// layout is what profsym reads of one libjvm build, from its tables:
// offsets of fields in bytes, sizes of types, and the link-time addresses
// (ELF virtual addresses, load bias not added) of statics.
type layout struct {
	version int    // feature release (8, 11, 17, 21, 25)
	arch    string // GOARCH of the JVM (the host's): its frames' layout

	// CodeBlob and its subclasses (BPF and host). With codeOffsets (8,
	// 23+) the code's bounds and the deopt handler are int offsets from
	// the blob, else (9-22) pointers.
	blobName, blobSize, blobCodeBegin, blobCodeEnd, blobHeader       uint64
	blobFrameComplete, blobFrameSize                                 uint64
	codeOffsets                                                      bool
	completeWidth                                                    uint8 // int (4) or int16_t (2, 23+)
	nmSize                                                           uint64
	nmCompileID, nmOrigPCOffset, nmDeoptHandler                      uint64
	nmMethod, nmScopesData, nmMetadataOff, nmScopesPCsOff, nmDepsOff uint64
	pcDescSize, pcDescPCOffset, pcDescScope                          uint64
	heapBlockSize                                                    uint64

	// The nmethod's debug information: nmInBlob or nmImmutable.
	nmDebug       int
	scopesPointer bool  // nmScopesData is a pointer (9-22), else an offset
	metaWidth     uint8 // of nmMetadataOff: int (8-22), uint16_t (23, 24)
	// 23+: the immutable data; 23, 24: metadata at the blob's data
	// (CodeBlob::_data_offset) + nmMetadataOff; 25+ (mutableData): after
	// the relocations in the blob's mutable data.
	nmImmutableData, nmImmutableSize            uint64
	blobDataOffset                              uint64
	mutableData                                 bool
	blobMutable, blobMutableSize, blobRelocSize uint64

	// Methods and classes (host; the BPF side reads the first three).
	methodConst, constMethodSize, cmCodeSize      uint64
	cmConstants, cmNameIndex, cmSigIndex, cmFlags uint64
	cmHasLineTable                                uint64 // flag bit
	cpHolder, cpSize, cpLength, klassName         uint64
	cpSourceFile, ikSourceFile                    uint64 // one of the two is 0
	symLength, symBody                            uint64

	// The code cache (statics are link-time addresses). JDK 8 has one
	// heap (ccHeap), the code cache's bounds its own.
	ccHeaps, ccHeap, ccLow, ccHigh      uint64
	gaLen, gaData                       uint64
	heapMemory, heapSegmap, heapLog2Seg uint64
	vsLowBoundary, vsHighBoundary       uint64
	interpCode, sqBuffer, sqLimit       uint64
	callStubRet                         uint64

	// Interpreter frames: word offsets from the frame pointer (x86-64).
	ifSenderSP, ifMethod, ifBCP int64

	// StubRoutines statics: routine name -> link-time address of the
	// variable holding its entry.
	stubs map[string]uint64
}

// Types whose fields and sizes the parse keeps.
var wantTypes = map[string]bool{}

func init() {
	for _, t := range []string{"CodeBlob", "CompiledMethod", "nmethod", "PcDesc", "HeapBlock", "Method",
		"ConstMethod", "ConstMethodFlags", "ConstantPool", "InstanceKlass", "Klass", "Symbol", "CodeCache",
		"GrowableArrayBase", "GenericGrowableArray", "GrowableArray<int>", "CodeHeap", "VirtualSpace",
		"Abstract_VM_Version", "JDK_Version", "StubRoutines", "frame", "AbstractInterpreter", "StubQueue"} {
		wantTypes[t] = true
	}
}

// Bounds for sanity checks: no HotSpot type is near these.
const (
	maxTypeSize = 4096
	maxOffset   = 1 << 12
)

// newLayout builds a layout from parsed tables and checks every value:
// offsets inside their types, sizes small, statics inside libjvm's
// segments. loads are libjvm's PT_LOAD segments; bias its load bias.
func newLayout(t *tables, loads []elfx.Segment, bias uint64, r reader) (*layout, error) {
	b := builder{t: t, loads: loads, bias: bias}
	l := &layout{stubs: map[string]uint64{}, arch: runtime.GOARCH}
	// JDK_Version::_current starts with the feature release (8 for
	// 1.8) up to 21; Abstract_VM_Version's is HotSpot's own (25 on JDK 8).
	var major uint64
	if b.hasStatic("JDK_Version::_current") {
		major = b.static("JDK_Version::_current") + b.off("JDK_Version", "_major")
	} else {
		major = b.static("Abstract_VM_Version::_vm_major_version")
	}
	if b.err != nil {
		return nil, b.err
	}
	var v [4]byte
	if err := r.Read(major+bias, v[:]); err != nil {
		return nil, err
	}
	if b.hasStatic("JDK_Version::_current") {
		l.version = int(v[0])
	} else {
		l.version = int(int32(uint32(v[0]) | uint32(v[1])<<8 | uint32(v[2])<<16 | uint32(v[3])<<24))
	}
	if l.version < minVersion || l.version > maxVersion {
		return nil, layoutErr("JDK %d (walked: %d to %d)", l.version, minVersion, maxVersion)
	}

	l.blobName = b.off("CodeBlob", "_name")
	l.blobSize = b.off("CodeBlob", "_size")
	// 9-22 keep pointers to the code; 8 and 23+ offsets from the blob.
	l.codeOffsets = !b.has("CodeBlob", "_code_begin")
	if l.codeOffsets {
		l.blobCodeBegin = b.off("CodeBlob", "_code_offset")
		l.blobCodeEnd = b.off("CodeBlob", "_data_offset")
	} else {
		l.blobCodeBegin = b.off("CodeBlob", "_code_begin")
		l.blobCodeEnd = b.off("CodeBlob", "_code_end")
	}
	l.blobDataOffset = b.off("CodeBlob", "_data_offset")
	l.blobHeader = b.size("CodeBlob")
	l.nmSize = b.size("nmethod")
	l.blobFrameComplete = b.off("CodeBlob", "_frame_complete_offset")
	l.completeWidth = b.width("CodeBlob", "_frame_complete_offset", 4)
	l.blobFrameSize = b.off("CodeBlob", "_frame_size")
	l.nmCompileID = b.off("nmethod", "_compile_id")
	l.nmOrigPCOffset = b.off("nmethod", "_orig_pc_offset")
	// 9-22 have CompiledMethod between CodeBlob and nmethod.
	nm := "nmethod"
	if b.has("CompiledMethod", "_method") {
		nm = "CompiledMethod"
	}
	l.nmMethod = b.off(nm, "_method")
	// A pointer in 9-22; an offset from the blob in 8 (_deoptimize_offset)
	// and 23+.
	l.nmDeoptHandler = b.off(nm, "_deopt_handler_begin", "_deopt_handler_offset", "_deoptimize_offset", "_deopt_handler_entry_offset")
	l.scopesPointer = b.has(nm, "_scopes_data_begin")
	l.nmScopesData = b.off(nm, "_scopes_data_begin", "_scopes_data_offset")
	l.nmScopesPCsOff = b.off("nmethod", "_scopes_pcs_offset")
	if b.has("nmethod", "_immutable_data") {
		l.nmDebug = nmImmutable
		l.nmImmutableData = b.off("nmethod", "_immutable_data")
		l.nmImmutableSize = b.off("nmethod", "_immutable_data_size")
		if b.has("CodeBlob", "_mutable_data") {
			l.mutableData = true
			l.blobMutable = b.off("CodeBlob", "_mutable_data")
			l.blobMutableSize = b.off("CodeBlob", "_mutable_data_size")
			l.blobRelocSize = b.off("CodeBlob", "_relocation_size")
		} else {
			l.nmMetadataOff = b.off("nmethod", "_metadata_offset")
			l.metaWidth = b.width("nmethod", "_metadata_offset", 2)
		}
	} else {
		l.nmMetadataOff = b.off("nmethod", "_metadata_offset")
		l.metaWidth = b.width("nmethod", "_metadata_offset", 4)
		l.nmDepsOff = b.off("nmethod", "_dependencies_offset")
	}
	l.pcDescSize = b.size("PcDesc")
	l.pcDescPCOffset = b.off("PcDesc", "_pc_offset")
	l.pcDescScope = b.off("PcDesc", "_scope_decode_offset")
	l.heapBlockSize = b.size("HeapBlock")

	l.methodConst = b.off("Method", "_constMethod")
	l.constMethodSize = b.size("ConstMethod")
	l.cmCodeSize = b.off("ConstMethod", "_code_size")
	l.cmConstants = b.off("ConstMethod", "_constants")
	l.cmNameIndex = b.off("ConstMethod", "_name_index")
	l.cmSigIndex = b.off("ConstMethod", "_signature_index")
	l.cmFlags = b.off("ConstMethod", "_flags", "_flags._flags") // 21: a struct around the flags
	l.cmHasLineTable = uint64(b.constant("ConstMethod::_has_linenumber_table", "ConstMethodFlags::_misc_has_linenumber_table"))
	l.cpHolder = b.off("ConstantPool", "_pool_holder")
	l.cpSize = b.size("ConstantPool")
	l.cpLength = b.off("ConstantPool", "_length")
	if b.has("ConstantPool", "_source_file_name_index") { // 15+
		l.cpSourceFile = b.off("ConstantPool", "_source_file_name_index")
	} else {
		l.ikSourceFile = b.off("InstanceKlass", "_source_file_name_index")
	}
	l.klassName = b.off("Klass", "_name")
	l.symLength = b.off("Symbol", "_length")
	l.symBody = b.off("Symbol", "_body")

	if b.hasStatic("CodeCache::_heaps") {
		l.ccHeaps = b.static("CodeCache::_heaps")
		l.ccLow = b.static("CodeCache::_low_bound")
		l.ccHigh = b.static("CodeCache::_high_bound")
		if b.has("GrowableArrayBase", "_len") { // 16+
			l.gaLen = b.off("GrowableArrayBase", "_len")
		} else {
			l.gaLen = b.off("GenericGrowableArray", "_len")
		}
		l.gaData = b.off("GrowableArray<int>", "_data")
	} else {
		l.ccHeap = b.static("CodeCache::_heap") // 8: one heap
	}
	l.heapMemory = b.off("CodeHeap", "_memory")
	l.heapSegmap = b.off("CodeHeap", "_segmap")
	l.heapLog2Seg = b.off("CodeHeap", "_log2_segment_size")
	l.vsLowBoundary = b.off("VirtualSpace", "_low_boundary")
	l.vsHighBoundary = b.off("VirtualSpace", "_high_boundary")
	l.interpCode = b.static("AbstractInterpreter::_code")
	l.sqBuffer = b.off("StubQueue", "_stub_buffer")
	l.sqLimit = b.off("StubQueue", "_buffer_limit")
	l.callStubRet = b.static("StubRoutines::_call_stub_return_address")

	// The last SP slot is exported; Method* follows below it, then
	// x86-64's mirror, mdp, cache, locals and bcp (frame_x86.hpp, JDK 9+),
	// arm64's mdp, a slot (padding up to JDK 20, the extended SP from 21),
	// mirror, cache, locals and bcp (frame_aarch64.hpp, JDK 17 and 21+).
	// JDK 8 exports no slot and has no mirror: on x86-64 its
	// frame_x86.hpp's are used.
	// arm64's vmStructs export none of the slots: frame_aarch64.hpp's are
	// used, for the releases whose header was read (17, 21 to 26).
	last := int64(-2)
	l.ifSenderSP = -1
	if l.arch != "arm64" && (l.version > 8 || b.hasConstant("frame::interpreter_frame_last_sp_offset")) {
		l.ifSenderSP = b.constant("frame::interpreter_frame_sender_sp_offset")
		last = b.constant("frame::interpreter_frame_last_sp_offset")
	}
	l.ifMethod = last - 1
	switch {
	case l.arch == "arm64" && l.version < 17:
		b.fail("JDK %d on arm64: its interpreter frame's slots are not known (17 and later are)", l.version)
	case l.arch == "arm64":
		l.ifBCP = l.ifMethod - 6
	case l.version == 8:
		l.ifBCP = l.ifMethod - 4
	default:
		l.ifBCP = l.ifMethod - 5
	}
	if b.err == nil && (l.ifSenderSP != -1 || last != -2) {
		b.fail("interpreter frame slots %d, %d (x86-64 and arm64 have -1, -2)", l.ifSenderSP, last)
	}

	for k, f := range t.fields {
		name, ok := strings.CutPrefix(k, "StubRoutines::_")
		if !ok || !f.static || strings.Contains(name, "table") || strings.Contains(name, "count") {
			continue
		}
		if addr, ok := b.inLoads(f.value); ok {
			l.stubs[name] = addr
		}
	}
	if b.err != nil {
		return nil, b.err
	}
	return l, l.check()
}

// check holds the cross-field invariants of a walkable layout.
func (l *layout) check() error {
	switch {
	case l.symLength+2 > l.symBody || l.symBody > 16:
		return layoutErr("Symbol: length at %d, body at %d", l.symLength, l.symBody)
	case l.pcDescSize < 8 || l.pcDescPCOffset+4 > l.pcDescSize || l.pcDescScope+4 > l.pcDescSize:
		return layoutErr("PcDesc of %d bytes", l.pcDescSize)
	case l.heapBlockSize == 0 || l.heapBlockSize > 64 || l.heapBlockSize%8 != 0:
		return layoutErr("HeapBlock of %d bytes", l.heapBlockSize)
	case l.cmHasLineTable == 0 || l.cmHasLineTable&(l.cmHasLineTable-1) != 0 || l.cmHasLineTable > 1<<15:
		return layoutErr("has_linenumber_table flag %#x", l.cmHasLineTable)
	case l.constMethodSize < 16 || l.cpSize < 16 || l.blobHeader < 16:
		return layoutErr("ConstMethod of %d bytes, ConstantPool of %d", l.constMethodSize, l.cpSize)
	}
	// The BPF walker reads these in one read of the blob's header.
	for _, o := range []uint64{l.blobName, l.blobSize, l.blobCodeBegin, l.blobFrameComplete, l.blobFrameSize,
		l.nmCompileID, l.nmOrigPCOffset, l.nmDeoptHandler} {
		if o+8 > blobHeaderBytes || o+4 > l.nmSize {
			return layoutErr("nmethod field at %d past the %d bytes the walker reads", o, blobHeaderBytes)
		}
	}
	// Fields read from the headers the host reads whole.
	for _, o := range []uint64{l.blobName, l.blobCodeBegin, l.blobCodeEnd, l.blobDataOffset, l.blobMutable, l.blobMutableSize, l.blobRelocSize} {
		if o+8 > l.blobHeader {
			return layoutErr("CodeBlob field at %d of %d bytes", o, l.blobHeader)
		}
	}
	for _, o := range []uint64{l.nmMethod + 8, l.nmScopesData + 8, l.nmMetadataOff + uint64(l.metaWidth), l.nmScopesPCsOff + 4,
		l.nmDepsOff + 4, l.nmImmutableData + 8, l.nmImmutableSize + 4} {
		if o > l.nmSize {
			return layoutErr("nmethod field at %d of %d bytes", o, l.nmSize)
		}
	}
	for _, o := range []uint64{l.cmConstants + 8, l.cmNameIndex + 2, l.cmSigIndex + 2, l.cmFlags + 2, l.cmCodeSize + 2} {
		if o > l.constMethodSize {
			return layoutErr("ConstMethod field ends at %d of %d bytes", o, l.constMethodSize)
		}
	}
	for _, o := range []uint64{l.cpHolder + 8, l.cpLength + 4, l.cpSourceFile + 2} {
		if o > l.cpSize {
			return layoutErr("ConstantPool field ends at %d of %d bytes", o, l.cpSize)
		}
	}
	return nil
}

// blobReadBytes is how much of a blob the walker reads: the fields it
// uses, rounded up to 64 bytes.
func (l *layout) blobReadBytes() uint64 {
	end := uint64(0)
	for _, o := range []uint64{l.blobName, l.blobSize, l.blobCodeBegin, l.blobFrameComplete, l.blobFrameSize,
		l.nmCompileID, l.nmOrigPCOffset, l.nmDeoptHandler} {
		end = max(end, o+8)
	}
	return min((end+63)&^63, blobHeaderBytes)
}

// blobHeaderBytes is how much of a CodeBlob the BPF walker reads at once
// (bpf/hotspot.h HS_BLOB_BYTES).
const blobHeaderBytes = 512

// builder collects lookups, keeping the first error.
type builder struct {
	t     *tables
	loads []elfx.Segment
	bias  uint64
	err   error
}

func (b *builder) fail(format string, args ...any) {
	if b.err == nil {
		b.err = layoutErr(format, args...)
	}
}

func (b *builder) has(typ, name string) bool {
	f, ok := b.t.fields[typ+"::"+name]
	return ok && !f.static
}

// off is a field's offset in typ (the first of names found), checked
// against the type's size.
func (b *builder) off(typ string, names ...string) uint64 {
	size, sized := b.t.types[typ]
	for _, n := range names {
		f, ok := b.t.fields[typ+"::"+n]
		if !ok || f.static {
			continue
		}
		if f.value >= maxOffset || (sized && f.value >= size) {
			b.fail("%s::%s at %d, type of %d bytes", typ, n, f.value, size)
		}
		return f.value
	}
	b.fail("no field %s::%s", typ, names[0])
	return 0
}

func (b *builder) hasStatic(name string) bool {
	f, ok := b.t.fields[name]
	return ok && f.static
}

// width is the width of an integer field from its C type, def when the
// tables do not say; anything but 2 or 4 bytes fails.
func (b *builder) width(typ, name string, def uint8) uint8 {
	w := b.t.fields[typ+"::"+name].width
	if w == 0 {
		w = def
	}
	if w != 2 && w != 4 {
		b.fail("%s::%s of %d bytes", typ, name, w)
	}
	return w
}

func (b *builder) size(typ string) uint64 {
	s, ok := b.t.types[typ]
	if !ok || s == 0 || s > maxTypeSize {
		b.fail("type %s of %d bytes", typ, s)
	}
	return s
}

// static is a static's link-time address, which must be in libjvm.
func (b *builder) static(name string) uint64 {
	f, ok := b.t.fields[name]
	if !ok || !f.static {
		b.fail("no static %s", name)
		return 0
	}
	addr, ok := b.inLoads(f.value)
	if !ok {
		b.fail("%s at %#x, outside libjvm", name, f.value)
	}
	return addr
}

// inLoads turns a run-time address into a link-time one if it lies in
// one of libjvm's segments.
func (b *builder) inLoads(addr uint64) (uint64, bool) {
	v := addr - b.bias
	for _, s := range b.loads {
		if v >= s.Vaddr && v-s.Vaddr < s.Memsz && v-s.Vaddr+8 <= s.Memsz {
			return v, true
		}
	}
	return 0, false
}

func (b *builder) hasConstant(name string) bool {
	_, ok := b.t.ints[name]
	return ok
}

func (b *builder) constant(names ...string) int64 {
	for _, n := range names {
		if v, ok := b.t.ints[n]; ok {
			return v
		}
	}
	b.fail("no constant %s", names[0])
	return 0
}
