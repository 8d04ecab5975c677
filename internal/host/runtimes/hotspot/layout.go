package hotspot

import (
	"strings"

	"github.com/profsym/profsym/internal/elfx"
)

// Versions walked: the layouts of OpenJDK 11 to 22 (CodeBlob with code
// pointers, CompiledMethod with scopes in the nmethod). 23 moved scopes to
// immutable data and code to offsets; its tables lack fields read here.
const (
	minVersion = 11
	maxVersion = 22
)

// layout is what profsym reads of one libjvm build, from its tables:
// offsets of fields in bytes, sizes of types, and the link-time addresses
// (ELF virtual addresses, load bias not added) of statics.
type layout struct {
	version int // feature release (11, 17, 21)

	// CodeBlob and its subclasses (BPF and host).
	blobName, blobSize, blobCodeBegin, blobCodeEnd, blobHeader       uint64
	blobFrameComplete, blobFrameSize                                 uint64
	nmSize                                                           uint64
	nmCompileID, nmOrigPCOffset, nmDeoptHandler                      uint64
	nmMethod, nmScopesData, nmMetadataOff, nmScopesPCsOff, nmDepsOff uint64
	pcDescSize, pcDescPCOffset, pcDescScope                          uint64
	heapBlockSize                                                    uint64

	// Methods and classes (host; the BPF side reads the first three).
	methodConst, constMethodSize, cmCodeSize      uint64
	cmConstants, cmNameIndex, cmSigIndex, cmFlags uint64
	cmHasLineTable                                uint64 // flag bit
	cpHolder, cpSize, cpLength, klassName         uint64
	cpSourceFile, ikSourceFile                    uint64 // one of the two is 0
	symLength, symBody                            uint64

	// The code cache (statics are link-time addresses).
	ccHeaps, ccLow, ccHigh              uint64
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
		"Abstract_VM_Version", "StubRoutines", "frame", "AbstractInterpreter", "StubQueue"} {
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
	l := &layout{stubs: map[string]uint64{}}
	major := b.static("Abstract_VM_Version::_vm_major_version")
	if b.err != nil {
		return nil, b.err
	}
	var v [4]byte
	if err := r.Read(major+bias, v[:]); err != nil {
		return nil, err
	}
	l.version = int(int32(uint32(v[0]) | uint32(v[1])<<8 | uint32(v[2])<<16 | uint32(v[3])<<24))
	if l.version < minVersion || l.version > maxVersion {
		return nil, layoutErr("JDK %d (walked: %d to %d)", l.version, minVersion, maxVersion)
	}

	l.blobName = b.off("CodeBlob", "_name")
	l.blobSize = b.off("CodeBlob", "_size")
	l.blobCodeBegin = b.off("CodeBlob", "_code_begin")
	l.blobCodeEnd = b.off("CodeBlob", "_code_end")
	l.blobHeader = b.size("CodeBlob")
	l.nmSize = b.size("nmethod")
	l.blobFrameComplete = b.off("CodeBlob", "_frame_complete_offset")
	l.blobFrameSize = b.off("CodeBlob", "_frame_size")
	l.nmCompileID = b.off("nmethod", "_compile_id")
	l.nmOrigPCOffset = b.off("nmethod", "_orig_pc_offset")
	l.nmDeoptHandler = b.off("CompiledMethod", "_deopt_handler_begin")
	l.nmMethod = b.off("CompiledMethod", "_method")
	l.nmScopesData = b.off("CompiledMethod", "_scopes_data_begin")
	l.nmMetadataOff = b.off("nmethod", "_metadata_offset")
	l.nmScopesPCsOff = b.off("nmethod", "_scopes_pcs_offset")
	l.nmDepsOff = b.off("nmethod", "_dependencies_offset")
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

	l.ccHeaps = b.static("CodeCache::_heaps")
	l.ccLow = b.static("CodeCache::_low_bound")
	l.ccHigh = b.static("CodeCache::_high_bound")
	if b.has("GrowableArrayBase", "_len") { // 16+
		l.gaLen = b.off("GrowableArrayBase", "_len")
	} else {
		l.gaLen = b.off("GenericGrowableArray", "_len")
	}
	l.gaData = b.off("GrowableArray<int>", "_data")
	l.heapMemory = b.off("CodeHeap", "_memory")
	l.heapSegmap = b.off("CodeHeap", "_segmap")
	l.heapLog2Seg = b.off("CodeHeap", "_log2_segment_size")
	l.vsLowBoundary = b.off("VirtualSpace", "_low_boundary")
	l.vsHighBoundary = b.off("VirtualSpace", "_high_boundary")
	l.interpCode = b.static("AbstractInterpreter::_code")
	l.sqBuffer = b.off("StubQueue", "_stub_buffer")
	l.sqLimit = b.off("StubQueue", "_buffer_limit")
	l.callStubRet = b.static("StubRoutines::_call_stub_return_address")

	// x86-64: the last SP slot is exported; Method*, then mirror, mdp,
	// cache, locals, bcp follow below it (frame_x86.hpp, JDK 9+).
	l.ifSenderSP = b.constant("frame::interpreter_frame_sender_sp_offset")
	last := b.constant("frame::interpreter_frame_last_sp_offset")
	l.ifMethod = last - 1
	l.ifBCP = l.ifMethod - 5
	if b.err == nil && (l.ifSenderSP != -1 || last != -2) {
		b.fail("interpreter frame slots %d, %d (x86-64 has -1, -2)", l.ifSenderSP, last)
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
	for _, o := range []uint64{l.blobName, l.blobCodeBegin, l.blobCodeEnd} {
		if o+8 > l.blobHeader {
			return layoutErr("CodeBlob field at %d of %d bytes", o, l.blobHeader)
		}
	}
	for _, o := range []uint64{l.nmMethod + 8, l.nmScopesData + 8, l.nmMetadataOff + 4, l.nmScopesPCsOff + 4, l.nmDepsOff + 4} {
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

func (b *builder) constant(names ...string) int64 {
	for _, n := range names {
		if v, ok := b.t.ints[n]; ok {
			return v
		}
	}
	b.fail("no constant %s", names[0])
	return 0
}
