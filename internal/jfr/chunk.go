// Package jfr reads Java Flight Recorder files: JDK recordings, and those
// async-profiler and the Datadog Java profiler write. It is driven by each
// chunk's own metadata, so event types and fields it does not know are
// skipped, and it treats its input as hostile: every length is checked
// against the bytes that remain and against Limits, constant-pool chains
// must run backwards, inline types may not contain themselves, and every
// error says where and why (wrapping ErrTruncated, ErrCorrupt or
// ErrLimit). Nothing in it panics on bad input.
package jfr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Limits bound what a recording may make the reader allocate or do.
type Limits struct {
	MaxChunkSize   int64 // bytes of one chunk, held in memory while it is read
	MaxStringLen   int   // bytes (or UTF-16 units) of one string
	MaxArrayLen    int   // elements of one array (stack frames, ...)
	MaxPoolEntries int   // constant-pool entries (and metadata strings/elements) per chunk
	MaxClasses     int   // types declared by one chunk's metadata
	MaxCPEvents    int   // constant-pool events chained in one chunk
	MaxChunks      int   // chunks in one recording
}

// DefaultLimits suit recordings of hundreds of megabytes.
func DefaultLimits() Limits {
	return Limits{
		MaxChunkSize:   1 << 30,
		MaxStringLen:   1 << 20,
		MaxArrayLen:    1 << 16,
		MaxPoolEntries: 1 << 24,
		MaxClasses:     1 << 16,
		MaxCPEvents:    1 << 16,
		MaxChunks:      1 << 16,
	}
}

func (l *Limits) fill() {
	def := DefaultLimits()
	if l.MaxChunkSize <= 0 {
		l.MaxChunkSize = def.MaxChunkSize
	}
	if l.MaxStringLen <= 0 {
		l.MaxStringLen = def.MaxStringLen
	}
	if l.MaxArrayLen <= 0 {
		l.MaxArrayLen = def.MaxArrayLen
	}
	if l.MaxPoolEntries <= 0 {
		l.MaxPoolEntries = def.MaxPoolEntries
	}
	if l.MaxClasses <= 0 {
		l.MaxClasses = def.MaxClasses
	}
	if l.MaxCPEvents <= 0 {
		l.MaxCPEvents = def.MaxCPEvents
	}
	if l.MaxChunks <= 0 {
		l.MaxChunks = def.MaxChunks
	}
}

// Visitor receives what a recording holds, chunk by chunk. Constant-pool
// ids in samples are valid only through the Chunk they came with, and only
// until ChunkEnd returns. Any callback may be nil; an error from one stops
// the parse and is returned.
type Visitor struct {
	Sample        func(c *Chunk, s *Sample) error
	NativeLibrary func(c *Chunk, l *NativeLibrary) error
	JVMInfo       func(c *Chunk, j *JVMInfo) error
	// Setting receives jdk.ActiveSetting events: async-profiler records
	// its options there (event=wall, interval, ...).
	Setting  func(c *Chunk, name, value string) error
	ChunkEnd func(c *Chunk) error
}

// Options configure Parse.
type Options struct {
	Limits Limits
	// ExecutionSampleKind is the profile jdk.ExecutionSample events go to:
	// KindCPU, or KindWall for async-profiler's wall-clock mode.
	ExecutionSampleKind Kind
}

const (
	headerSize  = 68
	typeMeta    = 0
	typeCPool   = 1
	flagCompInt = 1
)

var magic = []byte{'F', 'L', 'R', 0}

// Parse reads every chunk of the recording in r (size bytes) in order.
// One chunk is held in memory at a time.
func Parse(r io.ReaderAt, size int64, opt Options, v Visitor) error {
	opt.Limits.fill()
	if size < headerSize {
		var head [4]byte
		n, _ := r.ReadAt(head[:], 0)
		if n < 4 || string(head[:n]) != string(magic[:n]) {
			return fmt.Errorf("jfr: not a JFR file (no FLR magic): %w", ErrCorrupt)
		}
		return fmt.Errorf("jfr: %d bytes, shorter than a chunk header: %w", size, ErrTruncated)
	}
	var buf []byte
	var pos int64
	var mc metaCache
	for n := 0; pos < size; n++ {
		if n >= opt.Limits.MaxChunks {
			return fmt.Errorf("jfr: more than %d chunks: %w", opt.Limits.MaxChunks, ErrLimit)
		}
		var h [headerSize]byte
		if size-pos < headerSize {
			return fmt.Errorf("jfr: chunk %d at %d: %d bytes left, shorter than a chunk header: %w", n, pos, size-pos, ErrTruncated)
		}
		if _, err := r.ReadAt(h[:], pos); err != nil {
			return fmt.Errorf("jfr: chunk %d header: %w", n, err)
		}
		if string(h[:4]) != string(magic) {
			return fmt.Errorf("jfr: chunk %d at %d: bad magic %q (not a JFR file): %w", n, pos, h[:4], ErrCorrupt)
		}
		csize := int64(binary.BigEndian.Uint64(h[8:]))
		if csize < headerSize {
			return fmt.Errorf("jfr: chunk %d at %d: size %d (unfinished or corrupt chunk): %w", n, pos, csize, ErrCorrupt)
		}
		if csize > opt.Limits.MaxChunkSize {
			return fmt.Errorf("jfr: chunk %d at %d: size %d over the limit %d: %w", n, pos, csize, opt.Limits.MaxChunkSize, ErrLimit)
		}
		if csize > size-pos {
			return fmt.Errorf("jfr: chunk %d at %d: declares %d bytes, %d left: %w", n, pos, csize, size-pos, ErrTruncated)
		}
		if m, ok := r.(interface{ Bytes() []byte }); ok && int64(len(m.Bytes())) >= pos+csize {
			buf = m.Bytes()[pos : pos+csize] // in memory already: no copy
		} else {
			if int64(cap(buf)) < csize {
				buf = make([]byte, csize)
			}
			buf = buf[:csize]
			if _, err := r.ReadAt(buf, pos); err != nil && !(errors.Is(err, io.EOF) && pos+csize == size) {
				return fmt.Errorf("jfr: chunk %d: %w", n, err)
			}
		}
		c, err := newChunk(buf, &opt)
		if err == nil {
			err = c.parse(v, &mc)
		}
		if err != nil {
			return fmt.Errorf("jfr: chunk %d at %d: %w", n, pos, err)
		}
		pos += csize
	}
	return nil
}

// ParseBytes is Parse over a recording held in memory.
func ParseBytes(b []byte, opt Options, v Visitor) error {
	return Parse(bytesReaderAt(b), int64(len(b)), opt, v)
}

type bytesReaderAt []byte

func (b bytesReaderAt) Bytes() []byte { return b }

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Chunk is one chunk being read: its header, types and constant pools.
type Chunk struct {
	b                    []byte
	opt                  *Options
	major, minor         uint16
	cpOffset, metaOffset int64
	StartNanos           int64
	DurationNanos        int64
	startTicks           int64
	ticksPerSecond       int64
	compressed           bool
	meta                 *metadata

	strings    map[int64]str
	symbols    map[int64]str
	classes    map[int64]classEntry
	methods    map[int64]Method
	stacks     map[int64]*StackTrace
	threads    map[int64]threadEntry
	frameTypes map[int64]str
	states     map[int64]str
	attrValues map[int64]str
	entries    int
}

func newChunk(b []byte, opt *Options) (*Chunk, error) {
	c := &Chunk{b: b, opt: opt,
		major: binary.BigEndian.Uint16(b[4:]), minor: binary.BigEndian.Uint16(b[6:]),
		cpOffset: int64(binary.BigEndian.Uint64(b[16:])), metaOffset: int64(binary.BigEndian.Uint64(b[24:])),
		StartNanos: int64(binary.BigEndian.Uint64(b[32:])), DurationNanos: int64(binary.BigEndian.Uint64(b[40:])),
		startTicks: int64(binary.BigEndian.Uint64(b[48:])), ticksPerSecond: int64(binary.BigEndian.Uint64(b[56:])),
		compressed: b[67]&flagCompInt != 0}
	if c.major != 1 && c.major != 2 {
		return nil, fmt.Errorf("format version %d.%d, want 1.x or 2.x: %w", c.major, c.minor, ErrCorrupt)
	}
	if c.major == 1 {
		c.compressed = false
	}
	if b[64] == 255 {
		return nil, fmt.Errorf("chunk is still being written: %w", ErrTruncated)
	}
	if c.ticksPerSecond <= 0 {
		return nil, fmt.Errorf("%d ticks per second: %w", c.ticksPerSecond, ErrCorrupt)
	}
	for _, off := range []int64{c.cpOffset, c.metaOffset} {
		if off < headerSize || off >= int64(len(b)) {
			return nil, fmt.Errorf("header offset %d outside the chunk (%d bytes): %w", off, len(b), ErrCorrupt)
		}
	}
	return c, nil
}

func (c *Chunk) decoder(pos int64) *decoder {
	return &decoder{b: c.b, pos: int(pos), compressed: c.compressed, lim: &c.opt.Limits}
}

// eventHeader reads an event's size and type at pos and returns a decoder
// bounded to that event, positioned after the type.
func (c *Chunk) eventHeader(pos int64) (*decoder, int64, int64, error) {
	d := c.decoder(pos)
	size := int64(d.i32())
	if d.err != nil {
		return nil, 0, 0, d.err
	}
	if size <= 0 || size > int64(len(c.b))-pos {
		return nil, 0, 0, fmt.Errorf("event at %d: size %d, %d bytes left: %w", pos, size, int64(len(c.b))-pos, ErrCorrupt)
	}
	d.b = c.b[:pos+size]
	typ := int64(d.i64())
	if d.err != nil {
		return nil, 0, 0, fmt.Errorf("event at %d: %w", pos, d.err)
	}
	return d, size, typ, nil
}

// metaCache keeps the last chunk's parsed metadata: a JVM writes the same
// type system into every chunk, and parsing it is most of the work of a
// small chunk.
type metaCache struct {
	raw        []byte
	meta       *metadata
	compressed bool
}

func (c *Chunk) parse(v Visitor, mc *metaCache) error {
	d, size, typ, err := c.eventHeader(c.metaOffset)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if typ != typeMeta {
		return fmt.Errorf("metadata offset %d holds an event of type %d: %w", c.metaOffset, typ, ErrCorrupt)
	}
	d.i64() // start time
	d.i64() // duration
	d.i64() // metadata id
	if d.err != nil {
		return fmt.Errorf("metadata: %w", d.err)
	}
	// The type system itself, without the event's timestamps.
	raw := c.b[d.pos : c.metaOffset+size]
	if mc.meta != nil && bytes.Equal(raw, mc.raw) && c.compressed == mc.compressed {
		c.meta = mc.meta
	} else {
		if c.meta, err = readMetadata(d); err != nil {
			return err
		}
		mc.raw = append(mc.raw[:0], raw...)
		mc.meta, mc.compressed = c.meta, c.compressed
	}
	if err := c.readPools(); err != nil {
		return err
	}
	plans := map[int64]*eventPlan{}
	for pos := int64(headerSize); pos < int64(len(c.b)); {
		d, size, typ, err := c.eventHeader(pos)
		if err != nil {
			return err
		}
		pos += size
		if typ == typeMeta || typ == typeCPool {
			continue
		}
		p, ok := plans[typ]
		if !ok {
			p = c.plan(typ)
			plans[typ] = p
		}
		if p == nil {
			continue // a type nobody asked for: skipped by its size
		}
		if err := c.event(d, p, v); err != nil {
			return fmt.Errorf("event %s at %d: %w", p.cls.name, pos-size, err)
		}
	}
	if v.ChunkEnd != nil {
		return v.ChunkEnd(c)
	}
	return nil
}

// Slots: the fields of interest, by role.
const (
	sTime = iota
	sThread
	sStack
	sState
	sWeight
	sSize
	sTLAB
	sSamples
	sSpan
	sRootSpan
	sSpanName
	sContext
	sName
	sBase
	sTop
	sBuildID
	sLoadBias
	sPID
	sJVMName
	sJVMVersion
	sJavaArgs
	sValue
	numSlots
)

var slotNames = map[string]int{
	"startTime": sTime, "sampledThread": sThread, "eventThread": sThread, "stackTrace": sStack,
	"state": sState, "weight": sWeight, "allocationSize": sSize, "size": sSize, "tlabSize": sTLAB,
	"samples": sSamples, "spanId": sSpan, "localRootSpanId": sRootSpan, "spanName": sSpanName, "contextId": sContext,
	"name": sName, "baseAddress": sBase, "topAddress": sTop, "buildId": sBuildID, "loadBias": sLoadBias,
	"pid": sPID, "jvmName": sJVMName, "jvmVersion": sJVMVersion, "javaArguments": sJavaArgs,
	"value": sValue,
}

var stringSlots = [numSlots]bool{sName: true, sBuildID: true, sJVMName: true, sJVMVersion: true, sJavaArgs: true, sValue: true}

type eventRole uint8

const (
	roleSample eventRole = iota
	roleLibrary
	roleJVM
	roleSetting
)

type eventPlan struct {
	cls  *class
	role eventRole
	kind Kind
	slot []int8 // per field: a slot, or -1
	// ctx marks context-attribute fields (slot -2); attrs is the buffer
	// samples' Attrs point into.
	attrs []Attr
}

// slotContext marks a context-attribute field in eventPlan.slot.
const slotContext = -2

// maxContextAttrs bounds the context attributes kept per sample.
const maxContextAttrs = 16

func (c *Chunk) plan(typ int64) *eventPlan {
	cls := c.meta.classes[typ]
	if cls == nil {
		return nil
	}
	p := &eventPlan{cls: cls}
	switch cls.name {
	case "jdk.ExecutionSample":
		p.kind = c.opt.ExecutionSampleKind
	case "datadog.ExecutionSample":
		p.kind = KindCPU
	case "datadog.MethodSample", "profiler.WallClockSample":
		p.kind = KindWall
	case "jdk.NativeMethodSample":
		p.kind = KindNative
	case "jdk.ObjectAllocationSample", "jdk.ObjectAllocationInNewTLAB", "jdk.ObjectAllocationOutsideTLAB", "datadog.ObjectSample":
		p.kind = KindAlloc
	case "jdk.NativeLibrary":
		p.role = roleLibrary
	case "jdk.JVMInformation":
		p.role = roleJVM
	case "jdk.ActiveSetting":
		p.role = roleSetting
	default:
		return nil
	}
	p.slot = make([]int8, len(cls.fields))
	nctx := 0
	for i, f := range cls.fields {
		s, ok := slotNames[f.name]
		if !ok {
			p.slot[i] = -1
			if p.role == roleSample && f.cpool && !f.array && f.typ.name == "profiler.types.AttributeValue" && nctx < maxContextAttrs {
				p.slot[i] = slotContext
				nctx++
			}
			continue
		}
		// A field of an unexpected shape is skipped, not trusted.
		isStr := !f.array && f.typ.kind == kindString // inline, or a reference into the String pool
		isScalar := !f.array && (f.cpool || f.typ.kind != kindStruct && f.typ.kind != kindString)
		if stringSlots[s] && !isStr || !stringSlots[s] && !isScalar {
			p.slot[i] = -1
			continue
		}
		p.slot[i] = int8(s)
	}
	return p
}

func (c *Chunk) event(d *decoder, p *eventPlan, v Visitor) error {
	var vals [numSlots]uint64
	var has [numSlots]bool
	var strs [numSlots]str
	p.attrs = p.attrs[:0]
	for i := range p.cls.fields {
		f := &p.cls.fields[i]
		s := p.slot[i]
		switch {
		case s == slotContext:
			if id := int64(d.i64()); id != 0 {
				p.attrs = append(p.attrs, Attr{Name: f.name, Value: id})
			}
		case s < 0:
			d.skipField(f, 0)
		case stringSlots[s] && f.cpool:
			strs[s] = str{ref: int64(d.i64()), isRef: true}
			has[s] = true
		case stringSlots[s]:
			strs[s] = d.str()
			has[s] = true
		default:
			vals[s], has[s] = d.scalar(f, 0)
		}
		if d.err != nil {
			return d.err
		}
	}
	switch p.role {
	case roleLibrary:
		if v.NativeLibrary == nil {
			return nil
		}
		l := &NativeLibrary{Name: c.resolve(strs[sName]), BaseAddress: vals[sBase], TopAddress: vals[sTop],
			BuildID: c.resolve(strs[sBuildID]), LoadBias: vals[sLoadBias], HasBuildID: has[sBuildID], HasLoadBias: has[sLoadBias]}
		return v.NativeLibrary(c, l)
	case roleSetting:
		if v.Setting == nil {
			return nil
		}
		return v.Setting(c, c.resolve(strs[sName]), c.resolve(strs[sValue]))
	case roleJVM:
		if v.JVMInfo == nil {
			return nil
		}
		return v.JVMInfo(c, &JVMInfo{PID: int64(vals[sPID]), JVMName: c.resolve(strs[sJVMName]),
			Version: c.resolve(strs[sJVMVersion]), JavaArguments: c.resolve(strs[sJavaArgs])})
	}
	if v.Sample == nil {
		return nil
	}
	s := &Sample{Kind: p.kind, EventType: p.cls.name, Time: c.nanos(int64(vals[sTime])),
		Thread: int64(vals[sThread]), Stack: int64(vals[sStack]), State: int64(vals[sState]),
		SpanID: int64(vals[sSpan]), LocalRootSpanID: int64(vals[sRootSpan]), SpanName: int64(vals[sSpanName]),
		ContextID: int64(vals[sContext]), Weight: 1, Attrs: p.attrs}
	if p.kind == KindAlloc {
		s.Weight = allocWeight(p.cls.name, p, vals, has)
	} else {
		switch {
		case has[sSamples] && int64(vals[sSamples]) > 0:
			s.Weight = int64(vals[sSamples])
		case has[sWeight] && p.num(sWeight, vals) >= 1:
			s.Weight = int64(min(p.num(sWeight, vals), math.MaxInt32) + 0.5)
		}
	}
	return v.Sample(c, s)
}

// maxAllocWeight bounds the bytes one allocation sample may stand for
// (256 TiB): far above any real weight, far below what sums overflow at.
const maxAllocWeight = 1 << 48

// allocWeight is the bytes an allocation sample stands for.
func allocWeight(name string, p *eventPlan, vals [numSlots]uint64, has [numSlots]bool) int64 {
	var w float64
	switch name {
	case "jdk.ObjectAllocationSample":
		w = p.num(sWeight, vals)
	case "jdk.ObjectAllocationInNewTLAB":
		w = p.num(sTLAB, vals)
	case "datadog.ObjectSample":
		// size is the object's, weight (a float) how many it stands for.
		w = p.num(sSize, vals)
		if has[sWeight] {
			if x := p.num(sWeight, vals); x > 0 {
				w *= x
			}
		}
	default:
		w = p.num(sSize, vals)
	}
	if w < 0 || math.IsNaN(w) {
		return 0
	}
	if w > maxAllocWeight {
		return maxAllocWeight // hostile weights must not overflow sums
	}
	return int64(w + 0.5)
}

// num reads slot s as a number, whatever primitive type the field has.
func (p *eventPlan) num(s int, vals [numSlots]uint64) float64 {
	for i, sl := range p.slot {
		if int(sl) != s {
			continue
		}
		switch f := p.cls.fields[i]; {
		case f.cpool:
		case f.typ.kind == kindFloat:
			return f32(vals[s])
		case f.typ.kind == kindDouble:
			return f64(vals[s])
		default:
			return float64(int64(vals[s]))
		}
	}
	return 0
}

// nanos converts ticks to Unix nanoseconds.
func (c *Chunk) nanos(ticks int64) int64 {
	dt := ticks - c.startTicks
	sec := dt / c.ticksPerSecond
	rem := dt % c.ticksPerSecond
	return c.StartNanos + sec*1e9 + int64(float64(rem)*1e9/float64(c.ticksPerSecond))
}
