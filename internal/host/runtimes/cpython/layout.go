package cpython

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/profsym/profsym/bpf"
)

// lineFormat is how a code object maps instructions to lines.
type lineFormat uint8

const (
	linesLnotab    lineFormat = iota + 1 // 3.6-3.9: co_lnotab, byte offsets
	linesTable310                        // 3.10: co_linetable address ranges, byte offsets
	linesLocations                       // 3.11+: co_linetable location entries, code units
)

// layout is what the walker and the namer need to know about one
// interpreter build: where the fields they read are, and how frames link.
// Offsets are bytes from the start of the struct named in each comment.
type layout struct {
	minor   int    // 3.minor
	version uint64 // PY_VERSION_HEX, 0 when the build does not say

	kind     uint32 // bpf enum cpython_layout
	cframe   bool   // the thread state points to a _PyCFrame (3.11, 3.12)
	codeMask uint64 // f_code bits that are a pointer

	interpHead   uint64 // _PyRuntimeState.interpreters.head
	interpNext   uint64 // PyInterpreterState.next
	threadsHead  uint64 // PyInterpreterState: newest PyThreadState
	tsNext       uint64 // PyThreadState.next
	tsInterp     uint64 // PyThreadState.interp
	tsThreadID   uint64 // PyThreadState.thread_id (pthread_self)
	tsNativeID   uint64 // PyThreadState.native_thread_id, 0 before 3.11
	tsFrame      uint64 // PyThreadState: frame, cframe or current_frame
	cframeFrame  uint64 // _PyCFrame.current_frame
	fBack        uint64 // frame: previous / f_back
	fCode        uint64 // frame: f_code / f_executable
	fInstr       uint64 // frame: f_lasti (int, 3.9) or the instruction pointer
	fEntry       uint64 // frame: is_entry (3.11) or owner (3.12+)
	entryVal     uint64 // is_entry true, or the first owner value that marks an eval call's shim
	coCode       uint64 // PyCodeObject: first code unit (3.11+)
	coFilename   uint64
	coName       uint64
	coQualname   uint64 // 0 before 3.11
	coFirstline  uint64
	coLines      uint64 // co_lnotab (3.9) or co_linetable
	lines        lineFormat
	instrBytes   bool   // the walker records a byte offset (3.9, 3.11+); 3.10's f_lasti counts code units
	asciiData    uint64 // sizeof(PyASCIIObject): where a compact ASCII string's bytes are
	compactData  uint64 // sizeof(PyCompactUnicodeObject)
	bytesSize    uint64 // PyBytesObject.ob_size
	bytesData    uint64 // PyBytesObject.ob_sval
	typeMembers  uint64 // PyTypeObject.tp_members
	typeBasic    uint64 // PyTypeObject.tp_basicsize
	memberName   uint64 // PyMemberDef.name
	memberOffset uint64 // PyMemberDef.offset
	memberSize   uint64 // sizeof(PyMemberDef)
}

// Errors an interpreter build can be refused with.
var (
	errUnsupported = errors.New("unsupported Python version")
	errLayout      = errors.New("interpreter layout check failed")
)

// Layouts of the builds without _Py_DebugOffsets, per minor version: the
// offsets of x86-64 release builds (no Py_DEBUG, GIL), from CPython's own
// headers (offsetof over Include/internal of the version, compiled against
// Debian's libpython3.X-dev). The code object's and 3.9's frame object's
// fields are taken from the interpreter itself instead (PyCode_Type's and
// PyFrame_Type's tp_members) where it lists them; attach checks the rest
// against the live process (check.go).
func staticLayout(minor int) (layout, error) {
	l := layout{minor: minor, codeMask: ^uint64(0), bytesSize: 16, bytesData: 32,
		typeMembers: 240, typeBasic: 32, memberName: 0, memberOffset: 16, memberSize: 40,
		interpNext: 0, tsNext: 8, tsInterp: 16}
	switch minor {
	case 6:
		// No _PyRuntime: the interpreter list's head is pystate.c's static
		// interp_head, which the walker is given in its place (interp.go).
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS)
		l.interpHead, l.threadsHead = 0, 8
		l.tsFrame, l.tsThreadID = 24, 152
		l.fBack, l.fCode, l.fInstr = 24, 32, 120
		l.coFilename, l.coName, l.coFirstline, l.coLines = 96, 104, 36, 112
		l.lines, l.instrBytes = linesLnotab, true
		l.asciiData, l.compactData = 48, 72
	case 7, 8:
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS)
		l.interpHead, l.threadsHead = 32, 8
		if minor == 7 {
			l.interpHead = 24 // 3.8 added two ints (preinitializing, preinitialized) before it
		}
		l.tsFrame, l.tsThreadID = 24, 176
		l.fBack, l.fCode, l.fInstr = 24, 32, 104
		l.coFilename, l.coName, l.coFirstline, l.coLines = 104, 112, 40, 120
		if minor == 7 {
			l.coFilename, l.coName, l.coFirstline, l.coLines = 96, 104, 36, 112 // no co_posonlyargcount before 3.8
		}
		l.lines, l.instrBytes = linesLnotab, true
		l.asciiData, l.compactData = 48, 72
	case 9:
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS)
		l.interpHead, l.threadsHead = 32, 8
		l.tsFrame, l.tsThreadID = 24, 176
		l.fBack, l.fCode, l.fInstr = 24, 32, 104
		l.coFilename, l.coName, l.coFirstline, l.coLines = 104, 112, 40, 120
		l.lines, l.instrBytes = linesLnotab, true
		l.asciiData, l.compactData = 48, 72
	case 10:
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS)
		l.interpHead, l.threadsHead = 32, 8
		l.tsFrame, l.tsThreadID = 24, 176
		l.fBack, l.fCode, l.fInstr = 24, 32, 96
		l.coFilename, l.coName, l.coFirstline, l.coLines = 104, 112, 40, 120
		l.lines = linesTable310
		l.asciiData, l.compactData = 48, 72
	case 11:
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_ENTRY_FLAG)
		l.interpHead, l.threadsHead = 40, 16
		l.cframe, l.tsFrame, l.cframeFrame = true, 56, 8
		l.tsThreadID, l.tsNativeID = 152, 160
		l.fCode, l.fBack, l.fInstr, l.fEntry, l.entryVal = 32, 48, 56, 68, 1
		l.coCode, l.coFilename, l.coName, l.coQualname, l.coFirstline, l.coLines = 184, 112, 120, 128, 72, 136
		l.lines, l.instrBytes = linesLocations, true
		l.asciiData, l.compactData = 48, 72
	case 12:
		// FRAME_OWNED_BY_CSTACK (3) marks the shim each eval call pushes.
		l.kind = uint32(bpf.ProfileCpythonLayoutCPY_ENTRY_SHIM)
		l.interpHead, l.threadsHead = 40, 72
		l.cframe, l.tsFrame, l.cframeFrame = true, 56, 0
		l.tsThreadID, l.tsNativeID = 136, 144
		l.fCode, l.fBack, l.fInstr, l.fEntry, l.entryVal = 0, 8, 56, 70, 3
		l.coCode, l.coFilename, l.coName, l.coQualname, l.coFirstline, l.coLines = 192, 112, 120, 128, 68, 136
		l.lines, l.instrBytes = linesLocations, true
		l.asciiData, l.compactData = 40, 56
	default:
		return layout{}, fmt.Errorf("CPython 3.%d: %w (3.6 to 3.15 are)", minor, errUnsupported) //nolint:staticcheck // a name
	}
	return l, nil
}

// debugCookie starts _Py_DebugOffsets, the first field of _PyRuntime from
// 3.13 on: the interpreter's own description of its layout for
// out-of-process readers.
var debugCookie = []byte("xdebugpy")

// debugOffsets313 is _Py_DebugOffsets as 3.13 lays it out (all uint64).
type debugOffsets313 struct {
	Cookie       [8]byte
	Version      uint64
	FreeThreaded uint64
	Runtime      struct{ Size, Finalizing, InterpretersHead uint64 }
	Interp       struct {
		Size, ID, Next, ThreadsHead, GC, ImportsModules, Sysdict, Builtins, CevalGIL,
		GILRuntimeState, GILEnabled, GILLocked, GILHolder uint64
	}
	Thread struct {
		Size, Prev, Next, Interp, CurrentFrame, ThreadID, NativeThreadID, DatastackChunk, Status uint64
	}
	Frame struct{ Size, Previous, Executable, InstrPtr, Localsplus, Owner uint64 }
	Code  struct {
		Size, Filename, Name, Qualname, Linetable, Firstlineno, Argcount, LocalsplusNames,
		LocalsplusKinds, CoCodeAdaptive uint64
	}
	Object  struct{ Size, ObType uint64 }
	Type    struct{ Size, TpName, TpRepr, TpFlags uint64 }
	Tuple   struct{ Size, ObItem, ObSize uint64 }
	List    struct{ Size, ObItem, ObSize uint64 }
	Dict    struct{ Size, MaKeys, MaValues uint64 }
	Float   struct{ Size, ObFval uint64 }
	Long    struct{ Size, LvTag, ObDigit uint64 }
	Bytes   struct{ Size, ObSize, ObSval uint64 }
	Unicode struct{ Size, State, Length, ASCIISize uint64 }
	GC      struct{ Size, Collecting uint64 }
}

// debugOffsets314 is 3.14's, which grew fields in the middle.
type debugOffsets314 struct {
	Cookie       [8]byte
	Version      uint64
	FreeThreaded uint64
	Runtime      struct{ Size, Finalizing, InterpretersHead uint64 }
	Interp       struct {
		Size, ID, Next, ThreadsHead, ThreadsMain, GC, ImportsModules, Sysdict, Builtins, CevalGIL,
		GILRuntimeState, GILEnabled, GILLocked, GILHolder, CodeObjectGeneration, TLBCGeneration uint64
	}
	Thread struct {
		Size, Prev, Next, Interp, CurrentFrame, ThreadID, NativeThreadID, DatastackChunk, Status uint64
	}
	Frame struct{ Size, Previous, Executable, InstrPtr, Localsplus, Owner, Stackpointer, TLBCIndex uint64 }
	Code  struct {
		Size, Filename, Name, Qualname, Linetable, Firstlineno, Argcount, LocalsplusNames,
		LocalsplusKinds, CoCodeAdaptive, CoTLBC uint64
	}
	Object  struct{ Size, ObType uint64 }
	Type    struct{ Size, TpName, TpRepr, TpFlags uint64 }
	Tuple   struct{ Size, ObItem, ObSize uint64 }
	List    struct{ Size, ObItem, ObSize uint64 }
	Set     struct{ Size, Used, Table, Mask uint64 }
	Dict    struct{ Size, MaKeys, MaValues uint64 }
	Float   struct{ Size, ObFval uint64 }
	Long    struct{ Size, LvTag, ObDigit uint64 }
	Bytes   struct{ Size, ObSize, ObSval uint64 }
	Unicode struct{ Size, State, Length, ASCIISize uint64 }
}

// debugOffsets315 is 3.15's: the thread state grew fields after
// current_frame, the type object and Unicode fields at their ends, and a
// struct (err_stackitem) and a heap type object were added.
type debugOffsets315 struct {
	Cookie       [8]byte
	Version      uint64
	FreeThreaded uint64
	Runtime      struct{ Size, Finalizing, InterpretersHead uint64 }
	Interp       struct {
		Size, ID, Next, ThreadsHead, ThreadsMain, GC, ImportsModules, Sysdict, Builtins, CevalGIL,
		GILRuntimeState, GILEnabled, GILLocked, GILHolder, CodeObjectGeneration, TLBCGeneration uint64
	}
	Thread struct {
		Size, Prev, Next, Interp, CurrentFrame, BaseFrame, LastProfiledFrame, LastProfiledFrameSeq,
		ThreadID, NativeThreadID, DatastackChunk, Status, HoldsGIL, GILRequested, CurrentException, ExcState uint64
	}
	ErrStackItem struct{ ExcValue uint64 }
	Frame        struct{ Size, Previous, Executable, InstrPtr, Localsplus, Owner, Stackpointer, TLBCIndex uint64 }
	Code         struct {
		Size, Filename, Name, Qualname, Linetable, Firstlineno, Argcount, LocalsplusNames,
		LocalsplusKinds, CoCodeAdaptive, CoTLBC uint64
	}
	Object   struct{ Size, ObType uint64 }
	Type     struct{ Size, TpName, TpRepr, TpFlags, TpBasicsize, TpDictoffset uint64 }
	HeapType struct{ Size, HtCachedKeys uint64 }
	Tuple    struct{ Size, ObItem, ObSize uint64 }
	List     struct{ Size, ObItem, ObSize uint64 }
	Set      struct{ Size, Used, Table, Mask uint64 }
	Dict     struct{ Size, MaKeys, MaValues uint64 }
	Float    struct{ Size, ObFval uint64 }
	Long     struct{ Size, LvTag, ObDigit uint64 }
	Bytes    struct{ Size, ObSize, ObSval uint64 }
	Unicode  struct{ Size, State, Length, ASCIISize, CompactSize uint64 }
}

// debugOffsetsSize is how many bytes of _PyRuntime parseDebugOffsets reads.
const debugOffsetsSize = 1024

// parseDebugOffsets builds the layout of a 3.13+ interpreter from the
// _Py_DebugOffsets at the start of its _PyRuntime (b, from the file: the
// values are static initializers). minor is the version the file's name
// and Py_Version claim; the offsets must say the same.
func parseDebugOffsets(b []byte, minor int) (layout, error) {
	if len(b) < 24 || !bytes.Equal(b[:8], debugCookie) {
		return layout{}, fmt.Errorf("_PyRuntime does not start with _Py_DebugOffsets: %w", errLayout)
	}
	version := binary.LittleEndian.Uint64(b[8:])
	if got := int(version >> 16 & 0xff); version>>24 != 3 || got != minor {
		return layout{}, fmt.Errorf("_Py_DebugOffsets version %#x, the file says 3.%d: %w", version, minor, errLayout)
	}
	if binary.LittleEndian.Uint64(b[16:]) != 0 {
		return layout{}, fmt.Errorf("free-threaded build: %w", errUnsupported)
	}
	l := layout{minor: minor, version: version, kind: uint32(bpf.ProfileCpythonLayoutCPY_ENTRY_SHIM),
		codeMask: ^uint64(0), typeMembers: 240, typeBasic: 32, memberOffset: 16, memberSize: 40,
		lines: linesLocations, instrBytes: true}
	var ob, ty uint64
	switch minor {
	case 13:
		var d debugOffsets313
		if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &d); err != nil {
			return layout{}, fmt.Errorf("_Py_DebugOffsets: %w: %w", err, errLayout)
		}
		l.interpHead, l.interpNext, l.threadsHead = d.Runtime.InterpretersHead, d.Interp.Next, d.Interp.ThreadsHead
		l.tsNext, l.tsInterp, l.tsFrame, l.tsThreadID, l.tsNativeID = d.Thread.Next, d.Thread.Interp, d.Thread.CurrentFrame, d.Thread.ThreadID, d.Thread.NativeThreadID
		l.fBack, l.fCode, l.fInstr, l.fEntry = d.Frame.Previous, d.Frame.Executable, d.Frame.InstrPtr, d.Frame.Owner
		l.coCode, l.coFilename, l.coName, l.coQualname, l.coFirstline, l.coLines = d.Code.CoCodeAdaptive, d.Code.Filename, d.Code.Name, d.Code.Qualname, d.Code.Firstlineno, d.Code.Linetable
		l.bytesSize, l.bytesData, l.asciiData = d.Bytes.ObSize, d.Bytes.ObSval, d.Unicode.ASCIISize
		ob, ty = d.Object.ObType, d.Type.TpFlags
		// FRAME_OWNED_BY_CSTACK: the shim each eval call pushes.
		l.entryVal = 3
	case 14:
		var d debugOffsets314
		if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &d); err != nil {
			return layout{}, fmt.Errorf("_Py_DebugOffsets: %w: %w", err, errLayout)
		}
		l.interpHead, l.interpNext, l.threadsHead = d.Runtime.InterpretersHead, d.Interp.Next, d.Interp.ThreadsHead
		l.tsNext, l.tsInterp, l.tsFrame, l.tsThreadID, l.tsNativeID = d.Thread.Next, d.Thread.Interp, d.Thread.CurrentFrame, d.Thread.ThreadID, d.Thread.NativeThreadID
		l.fBack, l.fCode, l.fInstr, l.fEntry = d.Frame.Previous, d.Frame.Executable, d.Frame.InstrPtr, d.Frame.Owner
		l.coCode, l.coFilename, l.coName, l.coQualname, l.coFirstline, l.coLines = d.Code.CoCodeAdaptive, d.Code.Filename, d.Code.Name, d.Code.Qualname, d.Code.Firstlineno, d.Code.Linetable
		l.bytesSize, l.bytesData, l.asciiData = d.Bytes.ObSize, d.Bytes.ObSval, d.Unicode.ASCIISize
		ob, ty = d.Object.ObType, d.Type.TpFlags
		// FRAME_OWNED_BY_INTERPRETER, the eval call's entry frame, and
		// FRAME_OWNED_BY_CSTACK above it; f_executable is a _PyStackRef
		// whose low bit is a tag.
		l.entryVal = 3
		l.codeMask = ^uint64(7)
	case 15:
		var d debugOffsets315
		if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &d); err != nil {
			return layout{}, fmt.Errorf("_Py_DebugOffsets: %w: %w", err, errLayout)
		}
		l.interpHead, l.interpNext, l.threadsHead = d.Runtime.InterpretersHead, d.Interp.Next, d.Interp.ThreadsHead
		l.tsNext, l.tsInterp, l.tsFrame, l.tsThreadID, l.tsNativeID = d.Thread.Next, d.Thread.Interp, d.Thread.CurrentFrame, d.Thread.ThreadID, d.Thread.NativeThreadID
		l.fBack, l.fCode, l.fInstr, l.fEntry = d.Frame.Previous, d.Frame.Executable, d.Frame.InstrPtr, d.Frame.Owner
		l.coCode, l.coFilename, l.coName, l.coQualname, l.coFirstline, l.coLines = d.Code.CoCodeAdaptive, d.Code.Filename, d.Code.Name, d.Code.Qualname, d.Code.Firstlineno, d.Code.Linetable
		l.bytesSize, l.bytesData, l.asciiData, l.compactData = d.Bytes.ObSize, d.Bytes.ObSval, d.Unicode.ASCIISize, d.Unicode.CompactSize
		ob, ty = d.Object.ObType, d.Type.TpFlags
		if d.Type.TpBasicsize != l.typeBasic {
			return layout{}, fmt.Errorf("_Py_DebugOffsets: tp_basicsize at %d: %w", d.Type.TpBasicsize, errLayout)
		}
		// As 3.14, but FRAME_OWNED_BY_CSTACK is gone: the eval call's
		// entry frame (FRAME_OWNED_BY_INTERPRETER, 3) is the only shim.
		l.entryVal = 3
		l.codeMask = ^uint64(7)
	default:
		return layout{}, fmt.Errorf("Python 3.%d: %w", minor, errUnsupported)
	}
	if l.compactData == 0 {
		// PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject.
		l.compactData = l.asciiData + 16
	}
	if ob != 8 || ty != 168 {
		return layout{}, fmt.Errorf("_Py_DebugOffsets: ob_type at %d, tp_flags at %d: %w", ob, ty, errLayout)
	}
	return l, nil
}

// check bounds every offset the walker and the namer use: within what the
// BPF walker reads of a frame and of a code object, within the thread and
// interpreter state sizes a uint16 can say.
func (l *layout) check() error {
	frame := uint64(bpf.ProfileCpythonLimitsCPY_FRAME_READ)
	code := uint64(bpf.ProfileCpythonLimitsCPY_CODE_READ)
	for _, f := range []struct {
		name      string
		off, size uint64
		max       uint64
	}{
		{"interpreters.head", l.interpHead, 8, 1 << 16}, {"interp next", l.interpNext, 8, 1 << 16},
		{"threads head", l.threadsHead, 8, 1 << 16}, {"tstate next", l.tsNext, 8, 1 << 16},
		{"tstate interp", l.tsInterp, 8, 1 << 16}, {"thread_id", l.tsThreadID, 8, 1 << 16},
		{"tstate frame", l.tsFrame, 8, 1 << 16}, {"cframe frame", l.cframeFrame, 8, 1 << 16},
		{"f_back", l.fBack, 8, frame}, {"f_code", l.fCode, 8, frame}, {"f_instr", l.fInstr, 8, frame},
		{"f_entry", l.fEntry, 1, frame}, {"co_filename", l.coFilename, 8, code}, {"co_name", l.coName, 8, code},
		{"co_firstlineno", l.coFirstline, 4, code}, {"co_qualname", l.coQualname, 8, code},
		{"co_linetable", l.coLines, 8, code}, {"co_code_adaptive", l.coCode, 0, 1 << 16},
	} {
		if f.off+f.size > f.max {
			return fmt.Errorf("%s at %d, past %d: %w", f.name, f.off, f.max, errLayout)
		}
	}
	if l.coFilename < 16 || l.coName < 16 || l.fBack == l.fCode || l.coLines == 0 {
		return fmt.Errorf("code or frame fields overlap the object header: %w", errLayout)
	}
	return nil
}

// frameSize is how much of a frame the walker reads.
func (l *layout) frameSize() uint64 {
	n := max(l.fBack+8, l.fCode+8, l.fEntry+1)
	if l.kind == uint32(bpf.ProfileCpythonLayoutCPY_FRAME_OBJECTS) {
		return max(n, l.fInstr+4) // int f_lasti
	}
	return max(n, l.fInstr+8)
}

// codeSize is how much of a code object the walker reads.
func (l *layout) codeSize() uint64 {
	return max(16, l.coFilename+8, l.coName+8, l.coFirstline+4)
}
