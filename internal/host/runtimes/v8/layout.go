package v8

import (
	"fmt"

	"github.com/profsym/profsym/bpf"
)

// layout is what the walker and the namer need of one V8 build, from its
// v8dbg_* tables; the few fields those tables lack are constants of the
// V8 versions walked (named below), each checked on the live process.
type layout struct {
	fpContext, fpFunction, fpBytecode, fpBytecodeOff int64

	fnShared int64 // JSFunction::shared

	mapOff, instanceType int64 // HeapObject::map, Map::instance_type

	sfiName, sfiData, sfiScript int64
	scriptName, scriptSource    int64
	scriptLineEnds              int64

	strLength, seqOneChars, seqTwoChars int64
	consFirst, consSecond               int64
	slicedParent, slicedOffset          int64
	thinActual, extResource             int64
	arrayLength, arrayData              int64
	codeBytecode, codePositions         int64
	codeDeopt                           int64
	deopt                               deoptIndex

	typeSFI, typeScript, typeScopeInfo, typeBytecode, typeFixedArray, typeCode int64
	firstNonString                                                             int64
	encodingMask, oneByteTag, reprMask                                         int64
	seqTag, consTag, slicedTag, thinTag, externalTag                           int64

	// BytecodeArray's header size (its data, from the tables rounded to
	// a word) and its source_position_table field (not in the tables).
	bytecodeHeader, bytecodeSPT int64

	// ScopeInfo: the word of its context local count and of its first
	// local's name (v8dbg_scopeinfo_idx_*, counted after the map).
	scopeLocals, scopeFirst int64

	// jit: the code objects' fields the tables lack are known for this
	// V8 (11, Node 20; 13, Node 24), so optimized and baseline frames get
	// lines and inlined functions. Without, their frames get the
	// function's name.
	jit bool
	// bpfOpt: the kernel may tell optimized frames by JSFunction::code
	// (V8 11; V8 13 reaches the code through its dispatch table).
	bpfOpt bool
	// Code::flags, the InstructionStream's header before the
	// instructions, CodeKind::BASELINE, the deoptimization data's type,
	// and where a SharedFunctionInfoWrapper keeps its SFI (0: the data
	// holds the SFI itself).
	codeFlagsOff, istream, kindBaseline, typeDeopt, deoptWrapped int64
	// typeDeoptAlt is another type the deoptimization data may have (-1:
	// none): V8 12.4 makes it a TrustedFixedArray, 13 a
	// ProtectedFixedArray, of the same shape.
	typeDeoptAlt int64
	// Code::instruction_size, and whether the instructions follow the
	// Code object's header (V8 10) rather than an InstructionStream's.
	codeSizeOff int64
	codeInline  bool

	bytecodeSizes []byte // fileInfo.bytecodeSizes
}

// The constants every walk and name needs. Some are spelt by the C++
// type of the field, which V8 12 changed (Object became Tagged_Object_):
// aliases lists the other spellings.
var required = map[string]func(l *layout) *int64{
	"v8dbg_off_fp_context":                                             func(l *layout) *int64 { return &l.fpContext },
	"v8dbg_off_fp_function":                                            func(l *layout) *int64 { return &l.fpFunction },
	"v8dbg_off_fp_bytecode_array":                                      func(l *layout) *int64 { return &l.fpBytecode },
	"v8dbg_off_fp_bytecode_offset":                                     func(l *layout) *int64 { return &l.fpBytecodeOff },
	"v8dbg_class_JSFunction__shared__SharedFunctionInfo":               func(l *layout) *int64 { return &l.fnShared },
	"v8dbg_class_HeapObject__map__Map":                                 func(l *layout) *int64 { return &l.mapOff },
	"v8dbg_class_Map__instance_type__uint16_t":                         func(l *layout) *int64 { return &l.instanceType },
	"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object":       func(l *layout) *int64 { return &l.sfiName },
	"v8dbg_class_SharedFunctionInfo__function_data__Object":            func(l *layout) *int64 { return &l.sfiData },
	"v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject": func(l *layout) *int64 { return &l.sfiScript },
	"v8dbg_class_Script__name__Object":                                 func(l *layout) *int64 { return &l.scriptName },
	"v8dbg_class_Script__source__Object":                               func(l *layout) *int64 { return &l.scriptSource },
	"v8dbg_class_Script__line_ends__Object":                            func(l *layout) *int64 { return &l.scriptLineEnds },
	"v8dbg_class_String__length__int32_t":                              func(l *layout) *int64 { return &l.strLength },
	"v8dbg_class_SeqOneByteString__chars__char":                        func(l *layout) *int64 { return &l.seqOneChars },
	"v8dbg_class_SeqTwoByteString__chars__char":                        func(l *layout) *int64 { return &l.seqTwoChars },
	"v8dbg_class_ConsString__first__String":                            func(l *layout) *int64 { return &l.consFirst },
	"v8dbg_class_ConsString__second__String":                           func(l *layout) *int64 { return &l.consSecond },
	"v8dbg_class_SlicedString__parent__String":                         func(l *layout) *int64 { return &l.slicedParent },
	"v8dbg_class_SlicedString__offset__SMI":                            func(l *layout) *int64 { return &l.slicedOffset },
	"v8dbg_class_ThinString__actual__String":                           func(l *layout) *int64 { return &l.thinActual },
	"v8dbg_class_ExternalString__resource__Object":                     func(l *layout) *int64 { return &l.extResource },
	"v8dbg_class_FixedArrayBase__length__SMI":                          func(l *layout) *int64 { return &l.arrayLength },
	"v8dbg_class_FixedArray__data__uintptr_t":                          func(l *layout) *int64 { return &l.arrayData },
	"v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE":         func(l *layout) *int64 { return &l.typeSFI },
	"v8dbg_type_Script__SCRIPT_TYPE":                                   func(l *layout) *int64 { return &l.typeScript },
	"v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE":                            func(l *layout) *int64 { return &l.typeScopeInfo },
	"v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE":                    func(l *layout) *int64 { return &l.typeBytecode },
	"v8dbg_type_FixedArray__FIXED_ARRAY_TYPE":                          func(l *layout) *int64 { return &l.typeFixedArray },
	"v8dbg_type_Code__CODE_TYPE":                                       func(l *layout) *int64 { return &l.typeCode },
	"v8dbg_FirstNonstringType":                                         func(l *layout) *int64 { return &l.firstNonString },
	"v8dbg_StringEncodingMask":                                         func(l *layout) *int64 { return &l.encodingMask },
	"v8dbg_OneByteStringTag":                                           func(l *layout) *int64 { return &l.oneByteTag },
	"v8dbg_StringRepresentationMask":                                   func(l *layout) *int64 { return &l.reprMask },
	"v8dbg_SeqStringTag":                                               func(l *layout) *int64 { return &l.seqTag },
	"v8dbg_ConsStringTag":                                              func(l *layout) *int64 { return &l.consTag },
	"v8dbg_SlicedStringTag":                                            func(l *layout) *int64 { return &l.slicedTag },
	"v8dbg_ThinStringTag":                                              func(l *layout) *int64 { return &l.thinTag },
	"v8dbg_ExternalStringTag":                                          func(l *layout) *int64 { return &l.externalTag },
}

// aliases are other names of a required constant, in the V8s walked.
var aliases = map[string][]string{
	"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object": {
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
		"v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_", // V8 12.4
	},
	// V8 12 keeps the debug info apart from the script.
	"v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject": {
		"v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_",
	},
}

// The constants of code objects, which only the optimized and baseline
// frames' lines and inlined functions need.
var jitRequired = map[string]func(l *layout) *int64{
	"v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject": func(l *layout) *int64 { return &l.codeBytecode },
	"v8dbg_class_Code__source_position_table__ByteArray":         func(l *layout) *int64 { return &l.codePositions },
	"v8dbg_class_Code__deoptimization_data__FixedArray":          func(l *layout) *int64 { return &l.codeDeopt },
	"v8dbg_DeoptimizationDataSharedFunctionInfoIndex":            func(l *layout) *int64 { return &l.deopt.sfi },
	"v8dbg_DeoptimizationDataLiteralArrayIndex":                  func(l *layout) *int64 { return &l.deopt.literals },
	"v8dbg_DeoptimizationDataInliningPositionsIndex":             func(l *layout) *int64 { return &l.deopt.inlining },
}

// constant looks name up, or one of its aliases.
func constant(c map[string]int64, name string) (int64, bool) {
	if v, ok := c[name]; ok {
		return v, true
	}
	for _, a := range aliases[name] {
		if v, ok := c[a]; ok {
			return v, true
		}
	}
	return 0, false
}

// newLayout checks a build's constants: a V8 whose tables lack one, or
// whose values the walker cannot use, is refused with the reason.
func newLayout(c map[string]int64) (layout, error) {
	var l layout
	// V8 12 and later: the BytecodeArray lives in trusted space and the
	// SharedFunctionInfo points to it from trusted_function_data, the
	// first field, which the tables leave out (a full pointer without
	// the sandbox, which needs pointer compression, refused below).
	_, trusted := c["v8dbg_class_BytecodeArray__wrapper__Tagged_BytecodeWrapper_"]
	for name, field := range required {
		v, ok := constant(c, name)
		if !ok && trusted && name == "v8dbg_class_SharedFunctionInfo__function_data__Object" {
			v, ok = trustedData, true
		}
		if !ok {
			return l, fmt.Errorf("no %s: %w", name, errRefused)
		}
		*field(&l) = v
	}
	l.jit = true
	for name, field := range jitRequired {
		v, ok := c[name]
		l.jit = l.jit && ok
		*field(&l) = v
	}
	// The code object's fields the walker reads (jit.go) are V8 11's: a
	// V8 whose tables say otherwise names its JIT frames by function.
	for name, want := range map[string]int64{
		"v8dbg_class_Code__instruction_start__Address": codeInstrStart,
		"v8dbg_class_Code__flags__uint32_t":            codeFlags,
		"v8dbg_class_Code__instruction_size__int":      codeInstrSize,
	} {
		if v, ok := c[name]; ok && v != want {
			l.jit = false
		}
	}
	l.codeFlagsOff, l.istream, l.kindBaseline, l.typeDeopt = codeFlags, istreamHeader, codeKindBaseline, l.typeFixedArray
	l.typeDeoptAlt = -1
	l.codeSizeOff = codeInstrSize
	switch {
	case trusted:
		l.jit = trustedCode(c, &l)
	case !l.jit:
		l.jit = inlineCode(c, &l)
	}
	l.bpfOpt = l.jit && !trusted && !l.codeInline
	// Pointer compression (4-byte tagged fields) is not walked yet: its
	// Smis are 31 bits, its pointers offsets from a cage base.
	if c["v8dbg_SystemPointerSize"] != 8 || c["v8dbg_SmiShiftSize"] != 31 || c["v8dbg_HeapObjectTag"] != 1 ||
		c["v8dbg_SmiTag"] != 0 {
		return l, fmt.Errorf("tagged values of %d bytes, Smi shift %d: compressed pointers are not walked yet: %w",
			c["v8dbg_SystemPointerSize"], c["v8dbg_SmiShiftSize"], errRefused)
	}
	for _, o := range []int64{l.fpContext, l.fpFunction, l.fpBytecode, l.fpBytecodeOff} {
		if o > -8 || o < -int64(bpf.ProfileV8LimitsV8FRAME_BELOW) || o%8 != 0 {
			return l, fmt.Errorf("frame slot at fp%+d outside what the walker reads: %w", o, errRefused)
		}
	}
	for _, o := range []int64{
		l.fnShared, l.instanceType, l.sfiName, l.sfiData, l.sfiScript, l.scriptName,
		l.scriptSource, l.scriptLineEnds, l.strLength, l.seqOneChars, l.seqTwoChars, l.consFirst, l.consSecond,
		l.slicedParent, l.slicedOffset, l.thinActual, l.extResource, l.arrayLength, l.arrayData,
	} {
		if o < 0 || o > 256 {
			return l, fmt.Errorf("object field at %d: %w", o, errRefused)
		}
	}
	if l.mapOff != 0 || l.firstNonString <= 0 || l.firstNonString > 1<<16 {
		return l, fmt.Errorf("map at %d, first non-string type %d: %w", l.mapOff, l.firstNonString, errRefused)
	}
	if l.jit {
		for _, o := range []int64{l.codeBytecode, l.codePositions, l.codeDeopt, l.deopt.literals, l.deopt.inlining, l.deopt.sfi} {
			if o < 0 || o > 256 {
				l.jit = false
			}
		}
	}
	// BytecodeArray: map, length, constant_pool, handler_table,
	// source_position_table, then integers up to the bytecode (V8 10
	// and 11); V8 12 and later: map, length, wrapper,
	// source_position_table, handler_table, constant_pool, integers.
	l.bytecodeHeader, l.bytecodeSPT = 56, 32
	if trusted {
		l.bytecodeHeader, l.bytecodeSPT = 64, 24
	}
	if v, ok := c["v8dbg_class_BytecodeArray__data__uintptr_t"]; ok {
		l.bytecodeHeader = (v + 7) &^ 7
	}
	if l.bytecodeHeader < l.bytecodeSPT+8 || l.bytecodeHeader > 256 {
		return l, fmt.Errorf("bytecode at %d: %w", l.bytecodeHeader, errRefused)
	}
	l.scopeLocals, l.scopeFirst = 3, 4
	nl, ok1 := c["v8dbg_scopeinfo_idx_ncontextlocals"]
	fv, ok2 := c["v8dbg_scopeinfo_idx_first_vars"]
	if ok1 && ok2 {
		l.scopeLocals, l.scopeFirst = 1+nl, 1+fv
	}
	if l.scopeLocals < 1 || l.scopeLocals >= l.scopeFirst || l.scopeFirst > 16 {
		return l, fmt.Errorf("scope info locals at words %d, %d: %w", l.scopeLocals, l.scopeFirst, errRefused)
	}
	return l, nil
}

// bpf is the walker's entry for this layout.
func (l *layout) bpf() bpf.ProfileV8Proc {
	e := bpf.ProfileV8Proc{
		FpContext: int16(l.fpContext), FpFunction: int16(l.fpFunction), FpBytecode: int16(l.fpBytecode),
		FpBytecodeOff: int16(l.fpBytecodeOff), FnShared: uint16(l.fnShared), SmiShift: 32, Ready: 1,
		MapType: uint16(l.instanceType), TypeSfi: uint16(l.typeSFI),
		FnCode: fnCode, CodeStart: codeInstrStart, CodeFlags: codeFlags, CodeSize: codeInstrSize,
		KindMaglev: codeKindMaglev, KindTurbofan: codeKindTurbo,
	}
	if !l.bpfOpt {
		// No kind matches (it is 4 bits): every JIT frame is FRAME_V8_JIT,
		// named by its function, or by its code the host finds from the PC.
		e.KindMaglev, e.KindTurbofan = 0xffff, 0xffff
	}
	return e
}

// trustedData is SharedFunctionInfo::trusted_function_data (V8 12, 13).
const trustedData = 8

// inlineCode sets the code objects' layout of V8 10 (Node 18), checked
// on that version: the instructions follow the Code object's header
// (v8dbg_class_Code__instruction_start__uintptr_t is that header's size,
// 128), its deoptimization data (a FixedArray; a baseline code's
// BytecodeArray) at 16 and its source positions at 24, and the
// deoptimization data's literals, function and inlining positions at
// indices 2, 6 and 7, as in V8 11. The kernel does not tell optimized
// frames: JSFunction::code is such a Code, without an instruction start
// field to read.
func inlineCode(c map[string]int64, l *layout) bool {
	for name, v := range map[string]int64{
		"v8dbg_class_Code__instruction_start__uintptr_t": 128,
		"v8dbg_class_Code__instruction_size__int":        40,
		"v8dbg_class_Code__flags__uint32_t":              48,
	} {
		if got, ok := c[name]; !ok || got != v {
			return false
		}
	}
	if _, ok := c["v8dbg_class_JSFunction__code__CodeT"]; !ok {
		return false
	}
	l.codeInline, l.istream, l.codeSizeOff, l.codeFlagsOff = true, 128, 40, 48
	l.codeDeopt, l.codePositions, l.codeBytecode = 16, 24, 16
	l.deopt = deoptIndex{sfi: 6, literals: 2, inlining: 7}
	return true
}

// trustedCode sets the code objects' layout of V8 12.4 (Node 22) and 13
// (Node 24), checked on those versions: Code keeps its deoptimization
// data (a ProtectedFixedArray in 13, a TrustedFixedArray in 12.4, or a
// baseline code's BytecodeArray) at 8
// and its source positions at 16, full pointers into trusted space; the
// InstructionStream is map, Code, relocation info and sizes (32 bytes)
// before the instructions. V8 13's deoptimization data holds the function
// as a SharedFunctionInfoWrapper, V8 12.4's holds the SFI itself; the
// flags and the instruction size moved by 4 bytes between them. The rest
// comes from the tables, and a V8 whose tables say otherwise is not
// decoded.
func trustedCode(c map[string]int64, l *layout) bool {
	want := map[string]int64{
		"v8dbg_class_Code__instruction_start__Address":                    codeInstrStart,
		"v8dbg_class_Code__instruction_stream__Tagged_InstructionStream_": 32,
	}
	for name, v := range want {
		if got, ok := c[name]; !ok || got != v {
			return false
		}
	}
	get := func(name string, dst *int64) bool {
		v, ok := c[name]
		*dst = v
		return ok
	}
	if !get("v8dbg_class_Code__flags__uint32_t", &l.codeFlagsOff) ||
		!get("v8dbg_class_Code__instruction_size__int", &l.codeSizeOff) ||
		!get("v8dbg_CodeKindBaseline", &l.kindBaseline) ||
		!get("v8dbg_type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE", &l.typeDeopt) ||
		!get("v8dbg_DeoptimizationDataLiteralArrayIndex", &l.deopt.literals) ||
		!get("v8dbg_DeoptimizationDataInliningPositionsIndex", &l.deopt.inlining) {
		return false
	}
	if !get("v8dbg_type_TrustedFixedArray__TRUSTED_FIXED_ARRAY_TYPE", &l.typeDeoptAlt) {
		l.typeDeoptAlt = -1
	}
	if get("v8dbg_DeoptimizationDataWrappedSharedFunctionInfoIndex", &l.deopt.sfi) {
		if !get("v8dbg_class_SharedFunctionInfoWrapper__shared_info__Tagged_SharedFunctionInfo_", &l.deoptWrapped) ||
			l.deoptWrapped <= 0 || l.deoptWrapped > 64 {
			return false
		}
	} else if !get("v8dbg_DeoptimizationDataSharedFunctionInfoIndex", &l.deopt.sfi) {
		return false
	}
	// What baselineFrame reads: 24 bytes from the instruction start.
	if l.codeFlagsOff < codeInstrStart || l.codeFlagsOff+4 > codeInstrStart+24 ||
		l.codeSizeOff < codeInstrStart || l.codeSizeOff+4 > codeInstrStart+24 {
		return false
	}
	for _, o := range []int64{l.deopt.sfi, l.deopt.literals, l.deopt.inlining} {
		if o < 0 || o > 64 {
			return false
		}
	}
	l.codeDeopt, l.codePositions, l.codeBytecode, l.istream = 8, 16, 8, 32
	return true
}
