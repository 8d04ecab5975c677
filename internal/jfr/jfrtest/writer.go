// Package jfrtest writes JFR recordings for tests, in the shape the Datadog
// Java profiler (async-profiler inside) writes them: datadog.ExecutionSample
// and datadog.MethodSample events, jdk.NativeLibrary events with buildId and
// loadBias, and stack frames that may be Java, named native, or remote
// (build id + PC offset, frame type 7, absent from the FrameType pool).
// Tests use it where a real profiler cannot run here: remote frames at
// offsets the test chose, and hostile variants of a valid file.
package jfrtest

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Frame types as the Datadog profiler numbers them.
const (
	Interpreted  = 0
	JITCompiled  = 1
	Inlined      = 2
	Native       = 3
	CPP          = 4
	Kernel       = 5
	C1Compiled   = 6
	NativeRemote = 7 // not in the FrameType pool
)

// BCINativeRemote is the bytecode index of a remote frame.
const BCINativeRemote = -19

// Frame is one stack frame to write.
type Frame struct {
	Class, Method, Signature string
	Line, BCI                int32
	Type                     int64
	Modifiers                int32
}

// JavaFrame is a JIT-compiled Java frame; class in internal form (a/b/C).
func JavaFrame(class, method string, line int32) Frame {
	return Frame{Class: class, Method: method, Signature: "()V", Line: line, Type: JITCompiled, Modifiers: 0x9}
}

// NativeFrame is a native frame the profiler already named.
func NativeFrame(name string) Frame {
	return Frame{Method: name, Signature: "()L;", Type: Native, Modifiers: 0x100, BCI: -11}
}

// RemoteFrame is a native frame left for remote symbolication, exactly as
// fillRemoteFrameInfo writes it: class = bare build id, method "<remote>",
// signature "0x<offset>", modifiers ACC_NATIVE, BCI -19, frame type 7.
func RemoteFrame(buildID string, offset uint64) Frame {
	return Frame{Class: buildID, Method: "<remote>", Signature: "0x" + strconv.FormatUint(offset, 16),
		Modifiers: 0x100, BCI: BCINativeRemote, Type: NativeRemote}
}

// Library is a jdk.NativeLibrary event.
type Library struct {
	Name                string
	Base, Top, LoadBias uint64
	BuildID             string
}

// Recording accumulates events for one chunk.
type Recording struct {
	StartNanos     int64
	TicksPerSecond int64
	// Uncompressed writes fixed-width integers (chunk flag bit 0 clear).
	Uncompressed bool
	// ContextAttributes are the Datadog profiler's context attribute names
	// (its `attributes=` option), appended as fields to the datadog sample
	// events; set them before adding samples.
	ContextAttributes []string

	events  [][]byte
	threads map[int64]bool
	strs    map[string]int64
	classes map[string]int64
	methods map[Frame]int64
	mlist   []Frame
	stacks  map[string]int64
	slist   [][]Frame
	avals   map[string]int64
}

// New starts a recording at startNanos (Unix), with nanosecond ticks.
func New(startNanos int64) *Recording {
	return &Recording{StartNanos: startNanos, TicksPerSecond: 1e9, threads: map[int64]bool{},
		strs: map[string]int64{}, classes: map[string]int64{}, methods: map[Frame]int64{}, stacks: map[string]int64{},
		avals: map[string]int64{}}
}

// Type ids of the metadata below.
const (
	tBool = 4 + iota
	tChar
	tFloat
	tDouble
	tByte
	tShort
	tInt
	tLong
	tString
	tClass
	tThread
	tFrameType
	tThreadState
	tStackTrace
	tStackFrame
	tMethod
	tSymbol
	tExec
	tMethodSample
	tJDKExec
	tNativeLib
	tObjectSample
	tAttrValue
)

// Event names a sample event type.
type Event int

const (
	DatadogExecutionSample Event = tExec
	DatadogMethodSample    Event = tMethodSample
	JDKExecutionSample     Event = tJDKExec
)

// Sample adds a CPU or wall sample: at offset ticks from the start, on
// thread tid, with weight, frames leaf first.
func (r *Recording) Sample(ev Event, at int64, tid int64, weight int64, frames ...Frame) {
	r.SampleWith(ev, at, tid, weight, nil, frames...)
}

// SampleWith is Sample with context attribute values (by name, among
// ContextAttributes) on a datadog event.
func (r *Recording) SampleWith(ev Event, at int64, tid int64, weight int64, attrs map[string]string, frames ...Frame) {
	r.SampleIn(ev, at, tid, weight, 0, 0, attrs, frames...)
}

// SampleIn is SampleWith inside a span: the Datadog profiler's spanId and
// localRootSpanId fields (0: none).
func (r *Recording) SampleIn(ev Event, at, tid, weight, spanID, rootSpanID int64, attrs map[string]string, frames ...Frame) {
	var b enc
	b.compressed = !r.Uncompressed
	b.long(int64(ev))
	b.long(at)
	b.long(tid)
	r.threads[tid] = true
	b.long(r.stack(frames))
	b.long(1) // state RUNNABLE
	if ev != JDKExecutionSample {
		b.long(weight)
		b.long(spanID)
		b.long(rootSpanID)
		for _, name := range r.ContextAttributes {
			v, ok := attrs[name]
			if !ok {
				b.long(0)
				continue
			}
			id, seen := r.avals[v]
			if !seen {
				id = int64(len(r.avals) + 1)
				r.avals[v] = id
			}
			b.long(id)
		}
	}
	r.events = append(r.events, b.b)
}

// Alloc adds a datadog.ObjectSample of size bytes standing for weight objects.
func (r *Recording) Alloc(at, tid int64, class string, size int64, weight float32, frames ...Frame) {
	var b enc
	b.compressed = !r.Uncompressed
	b.long(tObjectSample)
	b.long(at)
	b.long(tid)
	r.threads[tid] = true
	b.long(r.stack(frames))
	b.long(r.class(class))
	b.long(size)
	b.fixed(4, uint64(math.Float32bits(weight)))
	r.events = append(r.events, b.b)
}

// Library adds a jdk.NativeLibrary event.
func (r *Recording) Library(l Library) {
	var b enc
	b.compressed = !r.Uncompressed
	b.long(tNativeLib)
	b.long(0)
	b.utf8(l.Name)
	b.long(int64(l.Base))
	b.long(int64(l.Top))
	b.utf8(l.BuildID)
	b.long(int64(l.LoadBias))
	r.events = append(r.events, b.b)
}

func (r *Recording) sym(s string) int64 {
	if id, ok := r.strs[s]; ok {
		return id
	}
	id := int64(len(r.strs) + 1)
	r.strs[s] = id
	return id
}

func (r *Recording) class(name string) int64 {
	if id, ok := r.classes[name]; ok {
		return id
	}
	id := int64(len(r.classes) + 1)
	r.classes[name] = id
	r.sym(name)
	return id
}

func (r *Recording) method(f Frame) int64 {
	k := Frame{Class: f.Class, Method: f.Method, Signature: f.Signature, Modifiers: f.Modifiers}
	if id, ok := r.methods[k]; ok {
		return id
	}
	id := int64(len(r.mlist) + 1)
	r.methods[k] = id
	r.mlist = append(r.mlist, k)
	r.class(f.Class)
	r.sym(f.Method)
	r.sym(f.Signature)
	return id
}

func (r *Recording) stack(frames []Frame) int64 {
	key := fmt.Sprint(frames)
	if id, ok := r.stacks[key]; ok {
		return id
	}
	for _, f := range frames {
		r.method(f)
	}
	id := int64(len(r.slist) + 1)
	r.stacks[key] = id
	r.slist = append(r.slist, frames)
	return id
}

// Layout says where the parts of a written chunk are, for tests that damage
// them.
type Layout struct {
	CPOffset, MetaOffset int64
	FirstEvent           int64
}

// Bytes writes the recording as one chunk.
func (r *Recording) Bytes() []byte {
	b, _ := r.Build()
	return b
}

// Build writes the recording as one chunk and says where its parts are.
func (r *Recording) Build() ([]byte, Layout) {
	out := make([]byte, 68)
	copy(out, "FLR\x00")
	binary.BigEndian.PutUint16(out[4:], 2)
	binary.BigEndian.PutUint16(out[6:], 1)
	var lay Layout
	lay.FirstEvent = 68
	for _, e := range r.events {
		out = append(out, r.sized(e)...)
	}
	lay.CPOffset = int64(len(out))
	out = append(out, r.sized(r.pool())...)
	lay.MetaOffset = int64(len(out))
	out = append(out, r.sized(r.metadata())...)
	binary.BigEndian.PutUint64(out[8:], uint64(len(out)))
	binary.BigEndian.PutUint64(out[16:], uint64(lay.CPOffset))
	binary.BigEndian.PutUint64(out[24:], uint64(lay.MetaOffset))
	binary.BigEndian.PutUint64(out[32:], uint64(r.StartNanos))
	binary.BigEndian.PutUint64(out[40:], uint64(1e9))
	binary.BigEndian.PutUint64(out[48:], 0)
	binary.BigEndian.PutUint64(out[56:], uint64(r.TicksPerSecond))
	out[67] = 2 // final chunk
	if !r.Uncompressed {
		out[67] |= 1
	}
	return out, lay
}

// sized prefixes an event body with its size (including the size field).
func (r *Recording) sized(body []byte) []byte {
	var b enc
	b.compressed = !r.Uncompressed
	if b.compressed {
		n := len(body) + 4
		b.b = append(b.b, byte(n)|0x80, byte(n>>7)|0x80, byte(n>>14)|0x80, byte(n>>21)&0x7f)
	} else {
		b.fixed(4, uint64(len(body)+4))
	}
	return append(b.b, body...)
}

func (r *Recording) pool() []byte {
	var b enc
	b.compressed = !r.Uncompressed
	b.long(1) // constant pool event
	b.long(0) // start
	b.long(0) // duration
	b.long(0) // delta: the only one
	b.b = append(b.b, 1)
	var pools [][]byte
	// add writes one pool; the JDK rejects empty ones, so those are left out.
	add := func(typ int64, n int, entries func(e *enc)) {
		if n == 0 {
			return
		}
		e := enc{compressed: b.compressed}
		e.long(typ)
		e.int(int32(n))
		entries(&e)
		pools = append(pools, e.b)
	}
	// FrameType 0..6: 7 (remote) is deliberately not listed, as in the
	// Datadog profiler.
	names := []string{"Interpreted", "JIT compiled", "Inlined", "Native", "C++", "Kernel", "C1 compiled"}
	add(tFrameType, len(names), func(e *enc) {
		for i, n := range names {
			e.long(int64(i))
			e.utf8(n)
		}
	})
	add(tThreadState, 1, func(e *enc) {
		e.long(1)
		e.utf8("RUNNABLE")
	})
	tids := make([]int64, 0, len(r.threads))
	for t := range r.threads {
		tids = append(tids, t)
	}
	slices.Sort(tids)
	add(tThread, len(tids), func(e *enc) {
		for _, t := range tids {
			e.long(t)
			e.utf8("thread-" + strconv.FormatInt(t, 10))
			e.long(t)
			e.utf8("thread-" + strconv.FormatInt(t, 10))
			e.long(t)
		}
	})
	add(tStackTrace, len(r.slist), func(e *enc) {
		for i, frames := range r.slist {
			e.long(int64(i + 1))
			e.b = append(e.b, 0) // not truncated
			e.int(int32(len(frames)))
			for _, f := range frames {
				e.long(r.method(f))
				e.int(f.Line)
				e.int(f.BCI)
				if e.compressed {
					e.b = append(e.b, byte(f.Type)) // put8, as the profiler writes it
				} else {
					e.long(f.Type)
				}
			}
		}
	})
	add(tMethod, len(r.mlist), func(e *enc) {
		for i, m := range r.mlist {
			e.long(int64(i + 1))
			e.long(r.class(m.Class))
			e.long(r.sym(m.Method))
			e.long(r.sym(m.Signature))
			e.int(m.Modifiers)
			e.b = append(e.b, 0)
		}
	})
	cls := make([]string, len(r.classes))
	for n, id := range r.classes {
		cls[id-1] = n
	}
	add(tClass, len(cls), func(e *enc) {
		for i, n := range cls {
			e.long(int64(i + 1))
			e.long(r.sym(n))
			e.int(1)
		}
	})
	syms := make([]string, len(r.strs))
	for s, id := range r.strs {
		syms[id-1] = s
	}
	add(tSymbol, len(syms), func(e *enc) {
		for i, s := range syms {
			e.long(int64(i + 1))
			e.utf8(s)
		}
	})
	vals := make([]string, len(r.avals))
	for v, id := range r.avals {
		vals[id-1] = v
	}
	add(tAttrValue, len(vals), func(e *enc) {
		for i, v := range vals {
			e.long(int64(i + 1))
			e.utf8(v)
		}
	})
	b.int(int32(len(pools)))
	for _, p := range pools {
		b.b = append(b.b, p...)
	}
	return b.b
}

type fieldDef struct {
	name  string
	typ   int
	cpool bool
	array bool
}

type classDef struct {
	id     int
	name   string
	super  string
	fields []fieldDef
}

func (r *Recording) metadata() []byte {
	sample := []fieldDef{{"startTime", tLong, false, false}, {"eventThread", tThread, true, false},
		{"stackTrace", tStackTrace, true, false}, {"state", tThreadState, true, false},
		{"weight", tLong, false, false}, {"spanId", tLong, false, false}, {"localRootSpanId", tLong, false, false}}
	for _, name := range r.ContextAttributes {
		sample = append(sample, fieldDef{name, tAttrValue, true, false})
	}
	classes := []classDef{
		{tBool, "boolean", "", nil}, {tChar, "char", "", nil}, {tFloat, "float", "", nil},
		{tDouble, "double", "", nil}, {tByte, "byte", "", nil}, {tShort, "short", "", nil},
		{tInt, "int", "", nil}, {tLong, "long", "", nil}, {tString, "java.lang.String", "", nil},
		{tClass, "java.lang.Class", "", []fieldDef{{"name", tSymbol, true, false}, {"modifiers", tInt, false, false}}},
		{tThread, "java.lang.Thread", "", []fieldDef{{"osName", tString, false, false}, {"osThreadId", tLong, false, false},
			{"javaName", tString, false, false}, {"javaThreadId", tLong, false, false}}},
		{tFrameType, "jdk.types.FrameType", "", []fieldDef{{"description", tString, false, false}}},
		{tThreadState, "jdk.types.ThreadState", "", []fieldDef{{"name", tString, false, false}}},
		{tStackTrace, "jdk.types.StackTrace", "", []fieldDef{{"truncated", tBool, false, false}, {"frames", tStackFrame, false, true}}},
		{tStackFrame, "jdk.types.StackFrame", "", []fieldDef{{"method", tMethod, true, false}, {"lineNumber", tInt, false, false},
			{"bytecodeIndex", tInt, false, false}, {"type", tFrameType, true, false}}},
		{tMethod, "jdk.types.Method", "", []fieldDef{{"type", tClass, true, false}, {"name", tSymbol, true, false},
			{"descriptor", tSymbol, true, false}, {"modifiers", tInt, false, false}, {"hidden", tBool, false, false}}},
		{tSymbol, "jdk.types.Symbol", "", []fieldDef{{"string", tString, false, false}}},
		{tAttrValue, "profiler.types.AttributeValue", "", []fieldDef{{"value", tString, false, false}}},
		{tExec, "datadog.ExecutionSample", "jdk.jfr.Event", sample},
		{tMethodSample, "datadog.MethodSample", "jdk.jfr.Event", sample},
		{tJDKExec, "jdk.ExecutionSample", "jdk.jfr.Event", []fieldDef{{"startTime", tLong, false, false},
			{"sampledThread", tThread, true, false}, {"stackTrace", tStackTrace, true, false}, {"state", tThreadState, true, false}}},
		{tNativeLib, "jdk.NativeLibrary", "jdk.jfr.Event", []fieldDef{{"startTime", tLong, false, false},
			{"name", tString, false, false}, {"baseAddress", tLong, false, false}, {"topAddress", tLong, false, false},
			{"buildId", tString, false, false}, {"loadBias", tLong, false, false}}},
		{tObjectSample, "datadog.ObjectSample", "jdk.jfr.Event", []fieldDef{{"startTime", tLong, false, false},
			{"eventThread", tThread, true, false}, {"stackTrace", tStackTrace, true, false},
			{"objectClass", tClass, true, false}, {"size", tLong, false, false}, {"weight", tFloat, false, false}}},
	}
	strs := map[string]int{}
	var list []string
	s := func(x string) int {
		if i, ok := strs[x]; ok {
			return i
		}
		strs[x] = len(list)
		list = append(list, x)
		return len(list) - 1
	}
	var tree enc
	tree.compressed = !r.Uncompressed
	elem := func(name string, attrs [][2]string, children int) {
		tree.int(int32(s(name)))
		tree.int(int32(len(attrs)))
		for _, a := range attrs {
			tree.int(int32(s(a[0])))
			tree.int(int32(s(a[1])))
		}
		tree.int(int32(children))
	}
	elem("root", nil, 2)
	elem("metadata", nil, len(classes))
	for _, c := range classes {
		attrs := [][2]string{{"id", strconv.Itoa(c.id)}, {"name", c.name}}
		if c.super != "" {
			attrs = append(attrs, [2]string{"superType", c.super})
		}
		elem("class", attrs, len(c.fields))
		for _, f := range c.fields {
			fa := [][2]string{{"name", f.name}, {"class", strconv.Itoa(f.typ)}}
			if f.cpool {
				fa = append(fa, [2]string{"constantPool", "true"})
			}
			if f.array {
				fa = append(fa, [2]string{"dimension", "1"})
			}
			elem("field", fa, 0)
		}
	}
	elem("region", [][2]string{{"locale", "en_US"}}, 0)
	var b enc
	b.compressed = !r.Uncompressed
	b.long(0) // metadata event
	b.long(0)
	b.long(0)
	b.long(1)
	b.int(int32(len(list)))
	for _, x := range list {
		b.utf8(x)
	}
	return append(b.b, tree.b...)
}

type enc struct {
	b          []byte
	compressed bool
}

func (e *enc) varint(v uint64) {
	for i := 0; i < 8; i++ {
		if v < 0x80 {
			e.b = append(e.b, byte(v))
			return
		}
		e.b = append(e.b, byte(v)|0x80)
		v >>= 7
	}
	e.b = append(e.b, byte(v))
}

func (e *enc) fixed(n int, v uint64) {
	for i := n - 1; i >= 0; i-- {
		e.b = append(e.b, byte(v>>(8*i)))
	}
}

func (e *enc) long(v int64) {
	if e.compressed {
		e.varint(uint64(v))
	} else {
		e.fixed(8, uint64(v))
	}
}

func (e *enc) int(v int32) {
	if e.compressed {
		e.varint(uint64(uint32(v)))
	} else {
		e.fixed(4, uint64(uint32(v)))
	}
}

func (e *enc) utf8(s string) {
	if s == "" {
		e.b = append(e.b, 1)
		return
	}
	e.b = append(e.b, 3)
	e.int(int32(len(s)))
	e.b = append(e.b, s...)
}
