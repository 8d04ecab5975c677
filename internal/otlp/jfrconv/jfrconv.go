// Package jfrconv turns JFR recordings (internal/jfr) into OTLP profiles as
// docs/frame-format.md and docs/jfr.md describe: one profile per sample
// type (cpu, wall, alloc, native), Java frames as `jvm` frames with
// Class.method and line, native frames the profiler named kept named, and
// the Datadog profiler's remote frames (build id + offset from the image
// base) as raw native locations on a mapping carrying the build id, for
// the symbolization processor to name. The jfr receiver and `profsym
// convert|top` both build through it.
package jfrconv

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// DefaultScopeName is the instrumentation scope of converted profiles.
const DefaultScopeName = "github.com/profsym/profsym/receiver/jfrreceiver"

// Options configure a conversion.
type Options struct {
	Limits jfr.Limits
	// ExecutionSampleKind is where jdk.ExecutionSample events go: cpu, or
	// wall for async-profiler's wall mode (Pyroscope's event=wall).
	ExecutionSampleKind jfr.Kind
	// Resource attributes set on the one ResourceProfiles (service.name,
	// host.name, ...); string, int64, bool or float64 values.
	Resource map[string]any
	// Labels names a sample's label context (Pyroscope's contextId): its
	// labels become sample attributes.
	Labels map[int64]map[string]string
	// Strings are the upload's label strings (Pyroscope's LabelsSnapshot),
	// where a sample's spanName id points.
	Strings      map[int64]string
	ScopeName    string
	ScopeVersion string
}

// Stats counts what a conversion saw.
type Stats struct {
	Events  map[string]int64 // sample events by JFR type
	Samples map[jfr.Kind]int64
	// Source names, per profile, the events it was made of when the
	// recording had more than one source of it (docs/jfr.md, "One source
	// per profile"); Ignored counts, by event type, the other sources'
	// events, left out so that nothing is counted twice.
	Source        map[jfr.Kind]string
	Ignored       map[string]int64
	RemoteFrames  int64 // remote frame locations made raw for the processor
	InvalidRemote int64 // remote frames whose build id or offset is not valid
	Chunks        int
	Libraries     int
}

// ConvertBytes converts a recording held in memory.
func ConvertBytes(b []byte, opt Options) (pprofile.Profiles, Stats, error) {
	return Convert(bytesAt(b), int64(len(b)), opt)
}

type bytesAt []byte

// Bytes lets the reader slice chunks instead of copying them.
func (b bytesAt) Bytes() []byte { return b }

func (b bytesAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Convert reads a recording (size bytes of r) into one Profiles.
func Convert(r io.ReaderAt, size int64, opt Options) (pprofile.Profiles, Stats, error) {
	c := newConverter(opt)
	err := jfr.Parse(r, size, jfr.Options{Limits: opt.Limits, ExecutionSampleKind: opt.ExecutionSampleKind}, jfr.Visitor{
		Sample:        c.sample,
		NativeLibrary: c.library,
		JVMInfo:       c.jvm,
		Setting:       c.setting,
		ChunkEnd:      c.chunkEnd,
	})
	if err != nil {
		return pprofile.NewProfiles(), c.st, err
	}
	return c.finish(), c.st, nil
}

type converter struct {
	opt  Options
	pd   pprofile.Profiles
	dict *pdict.Dict
	st   Stats
	pid  int64

	// per chunk
	pending   map[pendKey]*agg
	locs      map[locKey]int32
	libs      map[string]string // build id -> library path
	cNatives  bool              // "Native" frames are C functions (async-profiler)
	cNativesK bool              // cNatives is known for this chunk
	apStates  bool              // thread states are async-profiler's (STATE_DEFAULT)
	apStatesK bool
	wallEvent bool // async-profiler ran with event=wall

	// whole recording
	rows       [numBuckets]map[rowKey]*agg
	order      [numBuckets][]rowKey
	totals     [numBuckets]int64 // sum of values
	events     [numBuckets]int64
	maps       map[string]int32 // build id -> mapping
	start, end int64
	scratch    []int32
}

type pendKey struct {
	bucket        bucket
	stack, thread int64
	context       int64
	span, root    int64 // span ids (0: none)
	spanName      int64
	attrs         string // context attributes, rendered name\x00value\x00...
}

// bucket is where a sample is aggregated: one per source of each profile,
// kept apart until finish picks one source per profile, so that nothing is
// counted twice.
type bucket uint8

const (
	bCPUDatadog   bucket = iota // datadog.ExecutionSample
	bCPUJDK                     // jdk.ExecutionSample (JDK, async-profiler's cpu/itimer/ctimer)
	bWallDatadog                // datadog.MethodSample
	bWallProfiler               // profiler.WallClockSample (async-profiler 3)
	bWallJDK                    // jdk.ExecutionSample taken by a wall-clock sampler
	bNative                     // jdk.NativeMethodSample
	bAllocDatadog               // datadog.ObjectSample: the Datadog profiler's own sampler
	bAllocSampled               // jdk.ObjectAllocationSample: the JDK's throttled, weighted sampler
	bAllocTLAB                  // jdk.ObjectAllocationInNewTLAB/OutsideTLAB: one event per TLAB refill or large object
	numBuckets
)

// sources lists each profile's buckets in order of preference. Each
// source is an estimate of the same thing: a dd-trace-java recording with
// both engines on has the Datadog profiler's CPU samples and the JDK's, a
// JDK recording with the TLAB events turned on next to settings=profile's
// ObjectAllocationSample two estimates of the same allocations. Adding
// them would count everything twice, so a profile is made of the first
// source present. For allocations this is JDK Mission Control's rule (its
// heap page totals ObjectAllocationSample weights when a recording has any,
// the TLAB sizes otherwise).
var sources = [...][]bucket{
	jfr.KindCPU:    {bCPUDatadog, bCPUJDK},
	jfr.KindWall:   {bWallDatadog, bWallProfiler, bWallJDK},
	jfr.KindAlloc:  {bAllocDatadog, bAllocSampled, bAllocTLAB},
	jfr.KindNative: {bNative},
}

var sourceNames = [numBuckets]string{
	bCPUDatadog: "datadog.ExecutionSample", bCPUJDK: "jdk.ExecutionSample",
	bWallDatadog: "datadog.MethodSample", bWallProfiler: "profiler.WallClockSample", bWallJDK: "jdk.ExecutionSample",
	bNative:       "jdk.NativeMethodSample",
	bAllocDatadog: "datadog.ObjectSample", bAllocSampled: "jdk.ObjectAllocationSample",
	bAllocTLAB: "jdk.ObjectAllocationInNewTLAB/OutsideTLAB"}

// bucketOf places a sample. async-profiler (and the profilers built on
// it) mark the samples of its CPU events with the thread state
// STATE_DEFAULT, which the JDK never writes, and the samples its
// wall-clock sampler takes (`wall=` next to a CPU event, or event=wall)
// with the thread's real state: those are wall samples whatever the
// event type says, as async-profiler's own converter reads them.
func (c *converter) bucketOf(ch *jfr.Chunk, s *jfr.Sample) (bucket, bool) {
	switch s.Kind {
	case jfr.KindCPU, jfr.KindWall:
		switch s.EventType {
		case "datadog.ExecutionSample":
			return bCPUDatadog, true
		case "datadog.MethodSample":
			return bWallDatadog, true
		case "profiler.WallClockSample":
			return bWallProfiler, true
		}
		if s.Kind == jfr.KindWall || c.wallEvent {
			return bWallJDK, true
		}
		if !c.apStatesK {
			c.apStates, c.apStatesK = ch.HasThreadState("STATE_DEFAULT"), true
		}
		if c.apStates && ch.ThreadState(s.State) != "STATE_DEFAULT" {
			return bWallJDK, true
		}
		return bCPUJDK, true
	case jfr.KindNative:
		return bNative, true
	case jfr.KindAlloc:
		switch s.EventType {
		case "datadog.ObjectSample":
			return bAllocDatadog, true
		case "jdk.ObjectAllocationSample":
			return bAllocSampled, true
		}
		return bAllocTLAB, true
	}
	return 0, false
}

type rowKey struct {
	stack  int32
	thread string // rendered attributes
	attrs  string
}

type agg struct {
	value, first int64
	thread       int64
	attrs        []int32
}

type locKey struct {
	method int64
	line   int32
	typ    int64
	caller bool
}

func newConverter(opt Options) *converter {
	pd := pprofile.NewProfiles()
	c := &converter{opt: opt, pd: pd, dict: pdict.New(pd.Dictionary()), maps: map[string]int32{},
		libs: map[string]string{}, start: math.MaxInt64, end: math.MinInt64}
	c.st.Events = map[string]int64{}
	c.st.Samples = map[jfr.Kind]int64{}
	for i := range c.rows {
		c.rows[i] = map[rowKey]*agg{}
	}
	c.resetChunk()
	return c
}

func (c *converter) resetChunk() {
	c.pending = map[pendKey]*agg{}
	c.locs = map[locKey]int32{}
	c.cNativesK, c.apStatesK = false, false
}

func (c *converter) sample(ch *jfr.Chunk, s *jfr.Sample) error {
	c.st.Events[s.EventType]++
	b, ok := c.bucketOf(ch, s)
	if !ok || s.Weight <= 0 {
		return nil
	}
	c.events[b]++
	k := pendKey{bucket: b, stack: s.Stack, thread: s.Thread, context: s.ContextID,
		span: s.SpanID, root: s.LocalRootSpanID, spanName: s.SpanName}
	if len(s.Attrs) > 0 {
		var sb strings.Builder
		for _, a := range s.Attrs {
			if v := ch.AttributeValue(a.Value); v != "" {
				sb.WriteString(a.Name)
				sb.WriteByte(0)
				sb.WriteString(v)
				sb.WriteByte(0)
			}
		}
		k.attrs = sb.String()
	}
	a := c.pending[k]
	if a == nil {
		a = &agg{first: s.Time, thread: s.Thread}
		c.pending[k] = a
	}
	a.value += s.Weight
	a.first = min(a.first, s.Time)
	c.start = min(c.start, s.Time)
	c.end = max(c.end, s.Time)
	return nil
}

func (c *converter) library(_ *jfr.Chunk, l *jfr.NativeLibrary) error {
	c.st.Libraries++
	if l.BuildID == "" {
		return nil
	}
	if id, err := frame.ParseBuildID(l.BuildID); err == nil && len(c.libs) < 1<<16 {
		c.libs[id] = l.Name
	}
	return nil
}

// setting notes async-profiler's event=wall (jdk.ActiveSetting, written
// before any sample): its jdk.ExecutionSample events are then wall-clock
// samples, as Pyroscope's converter reads them too.
func (c *converter) setting(_ *jfr.Chunk, name, value string) error {
	if name == "event" {
		c.wallEvent = value == "wall"
	}
	return nil
}

func (c *converter) jvm(_ *jfr.Chunk, j *jfr.JVMInfo) error {
	if j.PID > 0 {
		c.pid = j.PID
	}
	return nil
}

// chunkEnd resolves the chunk's stacks, whose ids mean nothing past it,
// into the output dictionary and merges the chunk's samples.
func (c *converter) chunkEnd(ch *jfr.Chunk) error {
	c.st.Chunks++
	if c.start == math.MaxInt64 && ch.StartNanos > 0 {
		c.start = ch.StartNanos
	}
	c.end = max(c.end, ch.StartNanos+ch.DurationNanos)
	for k, a := range c.pending {
		stack := c.stack(ch, k.stack)
		tattrs, tkey := c.threadAttrs(ch, k.thread)
		attrs := tattrs
		akey := ""
		lab := c.opt.Labels[k.context]
		spanName := c.opt.Strings[k.spanName]
		if k.context != 0 && len(lab) > 0 || k.attrs != "" || k.span != 0 || k.root != 0 || k.spanName != 0 && spanName != "" {
			attrs = append([]int32(nil), tattrs...)
			keys := make([]string, 0, len(lab))
			for lk := range lab {
				keys = append(keys, lk)
			}
			slices.Sort(keys)
			for _, lk := range keys {
				attrs = append(attrs, c.dict.AttrStr(lk, lab[lk]))
			}
			// Datadog context attributes, under the names the profiler
			// was configured with.
			for rest := k.attrs; rest != ""; {
				var name, val string
				name, rest, _ = strings.Cut(rest, "\x00")
				val, rest, _ = strings.Cut(rest, "\x00")
				attrs = append(attrs, c.dict.AttrStr(name, val))
			}
			// Trace context: the span ids in the hex form traces use. No
			// JFR producer records the trace id, without which an OTLP link
			// cannot be made (docs/frame-format.md).
			if k.span != 0 {
				attrs = append(attrs, c.dict.AttrStr(frame.AttrSpanID, spanHex(k.span)))
			}
			if k.root != 0 {
				attrs = append(attrs, c.dict.AttrStr(frame.AttrLocalRootSpanID, spanHex(k.root)))
			}
			if k.spanName != 0 && spanName != "" {
				attrs = append(attrs, c.dict.AttrStr(frame.AttrSpanName, spanName))
			}
			var sb strings.Builder
			for _, ai := range attrs[len(tattrs):] {
				sb.WriteString(strconv.Itoa(int(ai)))
				sb.WriteByte(',')
			}
			akey = sb.String()
		}
		rk := rowKey{stack: stack, thread: tkey, attrs: akey}
		rows := c.rows[k.bucket]
		r := rows[rk]
		if r == nil {
			r = &agg{first: a.first, attrs: attrs}
			rows[rk] = r
			c.order[k.bucket] = append(c.order[k.bucket], rk)
		}
		r.value += a.value
		r.first = min(r.first, a.first)
		c.totals[k.bucket] += a.value
	}
	c.resetChunk()
	return nil
}

// spanHex renders a span id as traces do: 16 lowercase hex digits.
func spanHex(id int64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[id&0xf]
		id = int64(uint64(id) >> 4)
	}
	return string(b[:])
}

func (c *converter) threadAttrs(ch *jfr.Chunk, id int64) ([]int32, string) {
	t, ok := ch.Thread(id)
	if !ok {
		return nil, ""
	}
	name := t.JavaName
	if name == "" {
		name = t.OSName
	}
	tid := t.OSThreadID
	if tid == 0 {
		tid = t.JavaThreadID
	}
	attrs := []int32{c.dict.AttrInt(frame.AttrThreadID, tid)}
	if name != "" {
		attrs = append(attrs, c.dict.AttrStr(frame.AttrThreadName, name))
	}
	return attrs, strconv.FormatInt(tid, 10) + "\x00" + name
}

// stack converts a chunk's stack trace into the dictionary (leaf first, as
// JFR lists it).
func (c *converter) stack(ch *jfr.Chunk, id int64) int32 {
	st, ok := ch.Stack(id)
	if !ok || len(st.Frames) == 0 {
		return c.dict.Stack(nil)
	}
	locs := c.scratch[:0]
	for i := range st.Frames {
		locs = append(locs, c.location(ch, &st.Frames[i], i > 0))
	}
	c.scratch = locs
	return c.dict.Stack(locs)
}

func (c *converter) location(ch *jfr.Chunk, f *jfr.Frame, caller bool) int32 {
	k := locKey{method: f.Method, line: f.Line, typ: f.Type, caller: caller}
	if li, ok := c.locs[k]; ok {
		return li
	}
	li := c.newLocation(ch, f, caller)
	c.locs[k] = li
	return li
}

// Frame types of async-profiler and the Datadog profiler, by number, for
// ids the chunk's FrameType pool does not list.
const (
	rawNative       = 3
	rawCPP          = 4
	rawKernel       = 5
	rawNativeRemote = 7
)

func (c *converter) newLocation(ch *jfr.Chunk, f *jfr.Frame, caller bool) int32 {
	m, _ := ch.Method(f.Method)
	class := ch.ClassName(m.Class)
	name := ch.Symbol(m.Name)
	desc := ch.Symbol(m.Descriptor)
	if id, off, ok := parseRemote(class, name, desc); ok {
		return c.remoteLocation(id, off, caller, f.Type)
	} else if isRemoteSpelling(class, name) {
		c.st.InvalidRemote++
		display := name
		if class != "" {
			display = class + "." + name
		}
		return c.namedLocation(display+desc, display+desc, frame.TypeNative, 0, c.dict.AttrStr(frame.AttrError, frame.Reason(frame.ErrInvalidBuildID)))
	}
	desc2, known := ch.FrameType(f.Type)
	if !c.cNativesK {
		c.cNatives, c.cNativesK = ch.HasFrameType("Kernel"), true
	}
	ftype := frame.TypeJVM
	switch {
	case known && (desc2 == "Kernel"):
		ftype = frame.TypeKernel
	// async-profiler 3 and later write the library a C or C++ frame is in
	// as its class ("libjvm.so"): by their type they are native all the
	// same. In the JDK's own recordings "Native" is a Java native method,
	// which keeps its class and stays a Java frame.
	case known && desc2 == "C++", known && desc2 == "Native" && (class == "" || c.cNatives):
		ftype = frame.TypeNative
	case !known && (f.Type == rawNative || f.Type == rawCPP):
		ftype = frame.TypeNative
	case !known && f.Type == rawKernel:
		ftype = frame.TypeKernel
	case class == "" && m.Modifiers&0x100 != 0:
		ftype = frame.TypeNative
	}
	if ftype != frame.TypeJVM {
		return c.namedLocation(name, name, ftype, 0)
	}
	fn := frame.JavaMethod(class, name)
	line := int64(0)
	if f.Line > 0 {
		line = int64(f.Line)
	}
	return c.namedLocation(fn, fn+desc, frame.TypeJVM, line)
}

func (c *converter) namedLocation(name, system, ftype string, line int64, extra ...int32) int32 {
	fi := c.dict.Function(name, system, "", 0)
	attrs := append([]int32{c.dict.AttrStr(frame.AttrFrameType, ftype)}, extra...)
	return c.dict.Location(pdict.Location{Attrs: attrs, Lines: []pdict.Line{{Function: fi, Line: line}}})
}

// remoteLocation is a raw native location at the frame's offset from the
// image base; callers' offsets are return addresses, stepped back into the
// call instruction as the frame contract does for every caller.
func (c *converter) remoteLocation(id string, off uint64, caller bool, _ int64) int32 {
	c.st.RemoteFrames++
	if caller && off > 0 {
		off--
	}
	mi, ok := c.maps[id]
	if !ok {
		mi = c.dict.Mapping(pdict.Mapping{File: c.libs[id], Attrs: []int32{
			c.dict.AttrStr(frame.AttrBuildIDGNU, id), c.dict.AttrStr(frame.AttrAddressBase, frame.AddressBaseImage)}})
		c.maps[id] = mi
	}
	return c.dict.Location(pdict.Location{Mapping: mi, Address: off, Attrs: []int32{c.dict.AttrStr(frame.AttrFrameType, frame.TypeNative)}})
}

// remoteMethod is the method name of a remote frame.
const remoteMethod = "<remote>"

// parseRemote recognizes a remote frame: class = bare build id, method
// "<remote>", signature "0x1a2b" (as written), or the display spelling
// "<build-id>.<remote>(0x1a2b)" split however a tool split it.
func parseRemote(class, name, desc string) (string, uint64, bool) {
	id := class
	switch {
	case name == remoteMethod:
	case strings.HasSuffix(name, "."+remoteMethod) && class == "":
		id = strings.TrimSuffix(name, "."+remoteMethod)
	case class == "" && desc == "" && strings.Contains(name, "."+remoteMethod+"("):
		i := strings.Index(name, "."+remoteMethod+"(")
		id, desc = name[:i], name[i+len(remoteMethod)+1:]
	default:
		return "", 0, false
	}
	bid, err := frame.ParseBuildID(id)
	if err != nil {
		return "", 0, false
	}
	off, ok := parseOffset(desc)
	if !ok {
		return "", 0, false
	}
	return bid, off, true
}

func isRemoteSpelling(_, name string) bool { return strings.Contains(name, remoteMethod) }

func parseOffset(s string) (uint64, bool) {
	if strings.HasPrefix(s, "(") && strings.HasSuffix(s, ")") {
		s = s[1 : len(s)-1]
	}
	if len(s) < 3 || len(s) > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') {
		return 0, false
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	return v, err == nil
}

func (c *converter) finish() pprofile.Profiles {
	rp := c.pd.ResourceProfiles().AppendEmpty()
	res := rp.Resource().Attributes()
	if c.pid > 0 {
		res.PutInt(frame.AttrPID, c.pid)
	}
	for k, v := range c.opt.Resource {
		switch x := v.(type) {
		case string:
			res.PutStr(k, x)
		case int64:
			res.PutInt(k, x)
		case int:
			res.PutInt(k, int64(x))
		case bool:
			res.PutBool(k, x)
		case float64:
			res.PutDouble(k, x)
		default:
			res.PutStr(k, fmt.Sprint(x))
		}
	}
	sp := rp.ScopeProfiles().AppendEmpty()
	name := c.opt.ScopeName
	if name == "" {
		name = DefaultScopeName
	}
	sp.Scope().SetName(name)
	sp.Scope().SetVersion(c.opt.ScopeVersion)
	start, end := c.start, c.end
	if start == math.MaxInt64 {
		start, end = 0, 0
	}
	for _, kind := range jfr.Kinds {
		b := c.pick(kind)
		rows := c.rows[b]
		if len(rows) == 0 {
			continue
		}
		c.st.Samples[kind] = c.totals[b]
		p := sp.Profiles().AppendEmpty()
		st, su, pt, pu := profileTypes(kind)
		p.SampleType().SetTypeStrindex(c.dict.String(st))
		p.SampleType().SetUnitStrindex(c.dict.String(su))
		p.PeriodType().SetTypeStrindex(c.dict.String(pt))
		p.PeriodType().SetUnitStrindex(c.dict.String(pu))
		p.SetTime(pcommon.Timestamp(max(start, 0)))
		p.SetDurationNano(uint64(max(end-start, 0)))
		ss := p.Samples()
		ss.EnsureCapacity(len(rows))
		for _, rk := range c.order[b] {
			r := rows[rk]
			s := ss.AppendEmpty()
			s.SetStackIndex(rk.stack)
			s.Values().Append(r.value)
			s.TimestampsUnixNano().Append(uint64(max(r.first, 0)))
			s.AttributeIndices().FromRaw(r.attrs)
		}
	}
	return c.pd
}

// pick returns the bucket a kind's profile is made of, the preferred
// source present (sources), and counts the others' events as ignored.
func (c *converter) pick(kind jfr.Kind) bucket {
	srcs := sources[kind]
	chosen := srcs[0]
	for _, b := range srcs {
		if len(c.rows[b]) > 0 {
			chosen = b
			break
		}
	}
	for _, b := range srcs {
		if b != chosen && c.events[b] > 0 {
			if c.st.Source == nil {
				c.st.Source, c.st.Ignored = map[jfr.Kind]string{}, map[string]int64{}
			}
			c.st.Source[kind] = sourceNames[chosen]
			c.st.Ignored[sourceNames[b]] += c.events[b]
		}
	}
	return chosen
}

// profileTypes names a kind's sample and period types: samples/count over
// cpu, wall or native time, like the profiling receiver's cpu profile, and
// allocated bytes.
func profileTypes(k jfr.Kind) (sampleType, sampleUnit, periodType, periodUnit string) {
	switch k {
	case jfr.KindAlloc:
		return "alloc_space", "bytes", "space", "bytes"
	case jfr.KindWall:
		return "samples", "count", "wall", "nanoseconds"
	case jfr.KindNative:
		return "samples", "count", "native", "nanoseconds"
	}
	return "samples", "count", "cpu", "nanoseconds"
}
