// Package pdict indexes an OTLP profiles dictionary so that strings,
// attributes, functions, mappings, locations and stacks can be added without
// duplicates in O(1). pdata's Set* helpers scan the tables linearly, which is
// quadratic over a batch; the receiver, `profsym record` and the
// symbolization processor all build through this instead.
package pdict

import (
	"encoding/binary"
	"math"
	"strconv"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// Dict wraps a ProfilesDictionary with lookup maps. Not safe for concurrent
// use.
type Dict struct {
	D pprofile.ProfilesDictionary

	strs   map[string]int32
	attrs  map[string]int32
	funcs  map[funcKey]int32
	maps   map[string]int32
	locs   map[string]int32
	stacks map[string]int32
	links  map[[24]byte]int32

	buf []byte // scratch for keys
}

type funcKey struct {
	name, system, file int32
	startLine          int64
}

// New wraps d, adding the zero entries the format requires at index 0 of
// every table when they are missing. Each table is indexed lazily, on the
// first addition to it: the processor adds functions and attributes to
// batches whose locations and stacks it never needs to look up.
func New(d pprofile.ProfilesDictionary) *Dict {
	x := &Dict{D: d}
	if d.StringTable().Len() == 0 {
		d.StringTable().Append("")
	}
	if d.AttributeTable().Len() == 0 {
		d.AttributeTable().AppendEmpty()
	}
	if d.FunctionTable().Len() == 0 {
		d.FunctionTable().AppendEmpty()
	}
	if d.MappingTable().Len() == 0 {
		d.MappingTable().AppendEmpty()
	}
	if d.LocationTable().Len() == 0 {
		d.LocationTable().AppendEmpty()
	}
	if d.StackTable().Len() == 0 {
		d.StackTable().AppendEmpty()
	}
	return x
}

func (x *Dict) indexStrings() {
	st := x.D.StringTable()
	x.strs = make(map[string]int32, st.Len())
	for i := st.Len() - 1; i >= 0; i-- { // first occurrence wins
		x.strs[st.At(i)] = int32(i)
	}
}

func (x *Dict) indexAttrs() {
	t := x.D.AttributeTable()
	x.attrs = make(map[string]int32, t.Len())
	for i := t.Len() - 1; i >= 0; i-- {
		x.attrs[x.attrKey(t.At(i))] = int32(i)
	}
}

func (x *Dict) indexFuncs() {
	t := x.D.FunctionTable()
	x.funcs = make(map[funcKey]int32, t.Len())
	for i := t.Len() - 1; i >= 0; i-- {
		f := t.At(i)
		x.funcs[funcKey{f.NameStrindex(), f.SystemNameStrindex(), f.FilenameStrindex(), f.StartLine()}] = int32(i)
	}
}

func (x *Dict) indexMappings() {
	t := x.D.MappingTable()
	x.maps = make(map[string]int32, t.Len())
	for i := t.Len() - 1; i >= 0; i-- {
		x.maps[string(x.mappingKey(t.At(i)))] = int32(i)
	}
}

func (x *Dict) indexLocations() {
	t := x.D.LocationTable()
	x.locs = make(map[string]int32, t.Len())
	for i := t.Len() - 1; i >= 0; i-- {
		x.locs[string(x.locationKey(t.At(i)))] = int32(i)
	}
}

func (x *Dict) indexStacks() {
	t := x.D.StackTable()
	x.stacks = make(map[string]int32, t.Len())
	for i := t.Len() - 1; i >= 0; i-- {
		x.stacks[string(x.stackKey(t.At(i).LocationIndices().AsRaw()))] = int32(i)
	}
}

// String returns the index of s in the string table.
func (x *Dict) String(s string) int32 {
	if x.strs == nil {
		x.indexStrings()
	}
	if i, ok := x.strs[s]; ok {
		return i
	}
	i := int32(x.D.StringTable().Len())
	x.D.StringTable().Append(s)
	x.strs[s] = i
	return i
}

// StringIndex returns the index of s without adding it (-1 when absent).
func (x *Dict) StringIndex(s string) int32 {
	if x.strs == nil {
		x.indexStrings()
	}
	if i, ok := x.strs[s]; ok {
		return i
	}
	return -1
}

// Str returns the string at index i ("" when out of range).
func (x *Dict) Str(i int32) string {
	if i < 0 || int(i) >= x.D.StringTable().Len() {
		return ""
	}
	return x.D.StringTable().At(int(i))
}

// attrKey renders an attribute entry as a map key; only the value kinds
// profiles use (string, int, bool, double) are distinguished.
func (x *Dict) attrKey(kv pprofile.KeyValueAndUnit) string {
	v := kv.Value()
	var val string
	switch v.Type() {
	case pcommon.ValueTypeStr:
		val = "s" + v.Str()
	case pcommon.ValueTypeInt:
		val = "i" + strconv.FormatInt(v.Int(), 10)
	case pcommon.ValueTypeBool:
		val = "b" + strconv.FormatBool(v.Bool())
	case pcommon.ValueTypeDouble:
		val = "d" + strconv.FormatUint(math.Float64bits(v.Double()), 16)
	case pcommon.ValueTypeEmpty:
		val = "e"
	default:
		val = "o" + v.AsString()
	}
	return strconv.Itoa(int(kv.KeyStrindex())) + "\x00" + strconv.Itoa(int(kv.UnitStrindex())) + "\x00" + val
}

// AttrStr returns the index of the attribute key=value (string value).
func (x *Dict) AttrStr(key, value string) int32 {
	return x.attr(key, "s"+value, func(v pcommon.Value) { v.SetStr(value) })
}

// AttrInt returns the index of the attribute key=value (int value).
func (x *Dict) AttrInt(key string, value int64) int32 {
	return x.attr(key, "i"+strconv.FormatInt(value, 10), func(v pcommon.Value) { v.SetInt(value) })
}

// AttrBool returns the index of the attribute key=value (bool value).
func (x *Dict) AttrBool(key string, value bool) int32 {
	return x.attr(key, "b"+strconv.FormatBool(value), func(v pcommon.Value) { v.SetBool(value) })
}

// attr finds or adds an attribute; val is the value rendered as attrKey
// renders it, set writes it.
func (x *Dict) attr(key, val string, set func(pcommon.Value)) int32 {
	ki := x.String(key)
	k := strconv.Itoa(int(ki)) + "\x000\x00" + val
	if x.attrs == nil {
		x.indexAttrs()
	}
	if i, ok := x.attrs[k]; ok {
		return i
	}
	i := int32(x.D.AttributeTable().Len())
	kv := x.D.AttributeTable().AppendEmpty()
	kv.SetKeyStrindex(ki)
	set(kv.Value())
	x.attrs[k] = i
	return i
}

// Attr returns (key, value) of attribute index i.
func (x *Dict) Attr(i int32) (string, pcommon.Value, bool) {
	if i <= 0 || int(i) >= x.D.AttributeTable().Len() {
		return "", pcommon.NewValueEmpty(), false
	}
	kv := x.D.AttributeTable().At(int(i))
	return x.Str(kv.KeyStrindex()), kv.Value(), true
}

// FindAttr returns the value of the first attribute named key among idx.
func (x *Dict) FindAttr(idx pcommon.Int32Slice, key string) (pcommon.Value, bool) {
	if x.strs == nil {
		x.indexStrings()
	}
	ki, ok := x.strs[key]
	if !ok {
		return pcommon.NewValueEmpty(), false
	}
	return x.FindAttrKey(idx, ki)
}

// FindAttrKey is FindAttr with the key's string index, for loops that look
// the same key up many times.
func (x *Dict) FindAttrKey(idx pcommon.Int32Slice, ki int32) (pcommon.Value, bool) {
	for j := 0; j < idx.Len(); j++ {
		i := idx.At(j)
		if i <= 0 || int(i) >= x.D.AttributeTable().Len() {
			continue
		}
		kv := x.D.AttributeTable().At(int(i))
		if kv.KeyStrindex() == ki {
			return kv.Value(), true
		}
	}
	return pcommon.NewValueEmpty(), false
}

// Function returns the index of a function entry.
func (x *Dict) Function(name, systemName, file string, startLine int64) int32 {
	k := funcKey{x.String(name), x.String(systemName), x.String(file), startLine}
	if x.funcs == nil {
		x.indexFuncs()
	}
	if i, ok := x.funcs[k]; ok {
		return i
	}
	i := int32(x.D.FunctionTable().Len())
	f := x.D.FunctionTable().AppendEmpty()
	f.SetNameStrindex(k.name)
	f.SetSystemNameStrindex(k.system)
	f.SetFilenameStrindex(k.file)
	f.SetStartLine(startLine)
	x.funcs[k] = i
	return i
}

// Mapping describes a mapping to add.
type Mapping struct {
	Start, Limit, Offset uint64
	File                 string
	Attrs                []int32
}

func (x *Dict) mappingKey(m pprofile.Mapping) []byte {
	b := x.buf[:0]
	b = binary.LittleEndian.AppendUint64(b, m.MemoryStart())
	b = binary.LittleEndian.AppendUint64(b, m.MemoryLimit())
	b = binary.LittleEndian.AppendUint64(b, m.FileOffset())
	b = binary.LittleEndian.AppendUint32(b, uint32(m.FilenameStrindex()))
	for _, a := range m.AttributeIndices().All() {
		b = binary.LittleEndian.AppendUint32(b, uint32(a))
	}
	x.buf = b
	return b
}

// Mapping returns the index of a mapping entry.
func (x *Dict) Mapping(m Mapping) int32 {
	if x.maps == nil {
		x.indexMappings() // before building the key: indexing uses the scratch buffer
	}
	file := x.String(m.File)
	b := x.buf[:0]
	b = binary.LittleEndian.AppendUint64(b, m.Start)
	b = binary.LittleEndian.AppendUint64(b, m.Limit)
	b = binary.LittleEndian.AppendUint64(b, m.Offset)
	b = binary.LittleEndian.AppendUint32(b, uint32(file))
	for _, a := range m.Attrs {
		b = binary.LittleEndian.AppendUint32(b, uint32(a))
	}
	x.buf = b
	if i, ok := x.maps[string(b)]; ok {
		return i
	}
	i := int32(x.D.MappingTable().Len())
	mp := x.D.MappingTable().AppendEmpty()
	mp.SetMemoryStart(m.Start)
	mp.SetMemoryLimit(m.Limit)
	mp.SetFileOffset(m.Offset)
	mp.SetFilenameStrindex(file)
	mp.AttributeIndices().FromRaw(m.Attrs)
	x.maps[string(b)] = i
	return i
}

// Line is one line entry of a location.
type Line struct {
	Function     int32
	Line, Column int64
}

// Location describes a location to add.
type Location struct {
	Mapping int32
	Address uint64
	Attrs   []int32
	Lines   []Line
}

func (x *Dict) locationKey(l pprofile.Location) []byte {
	b := x.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(l.MappingIndex()))
	b = binary.LittleEndian.AppendUint64(b, l.Address())
	b = binary.LittleEndian.AppendUint32(b, uint32(l.AttributeIndices().Len()))
	for _, a := range l.AttributeIndices().All() {
		b = binary.LittleEndian.AppendUint32(b, uint32(a))
	}
	for _, ln := range l.Lines().All() {
		b = binary.LittleEndian.AppendUint32(b, uint32(ln.FunctionIndex()))
		b = binary.LittleEndian.AppendUint64(b, uint64(ln.Line()))
		b = binary.LittleEndian.AppendUint64(b, uint64(ln.Column()))
	}
	x.buf = b
	return b
}

// Location returns the index of a location entry.
func (x *Dict) Location(l Location) int32 {
	if x.locs == nil {
		x.indexLocations()
	}
	b := x.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(l.Mapping))
	b = binary.LittleEndian.AppendUint64(b, l.Address)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(l.Attrs)))
	for _, a := range l.Attrs {
		b = binary.LittleEndian.AppendUint32(b, uint32(a))
	}
	for _, ln := range l.Lines {
		b = binary.LittleEndian.AppendUint32(b, uint32(ln.Function))
		b = binary.LittleEndian.AppendUint64(b, uint64(ln.Line))
		b = binary.LittleEndian.AppendUint64(b, uint64(ln.Column))
	}
	x.buf = b
	if i, ok := x.locs[string(b)]; ok {
		return i
	}
	i := int32(x.D.LocationTable().Len())
	loc := x.D.LocationTable().AppendEmpty()
	loc.SetMappingIndex(l.Mapping)
	loc.SetAddress(l.Address)
	loc.AttributeIndices().FromRaw(l.Attrs)
	for _, ln := range l.Lines {
		pl := loc.Lines().AppendEmpty()
		pl.SetFunctionIndex(ln.Function)
		pl.SetLine(ln.Line)
		pl.SetColumn(ln.Column)
	}
	x.locs[string(b)] = i
	return i
}

func (x *Dict) stackKey(locs []int32) []byte {
	b := x.buf[:0]
	for _, l := range locs {
		b = binary.LittleEndian.AppendUint32(b, uint32(l))
	}
	x.buf = b
	return b
}

// Stack returns the index of a stack (location indices, leaf first).
func (x *Dict) Stack(locs []int32) int32 {
	if x.stacks == nil {
		x.indexStacks()
	}
	b := x.stackKey(locs)
	if i, ok := x.stacks[string(b)]; ok {
		return i
	}
	i := int32(x.D.StackTable().Len())
	x.D.StackTable().AppendEmpty().LocationIndices().FromRaw(locs)
	x.stacks[string(b)] = i
	return i
}

// Link returns the index of the link_table entry for a span (trace id and
// span id), adding it if missing; index 0, added with the first, is the
// empty link ("no span"). The table is indexed on first use.
func (x *Dict) Link(trace pcommon.TraceID, span pcommon.SpanID) int32 {
	if x.links == nil {
		t := x.D.LinkTable()
		if t.Len() == 0 {
			t.AppendEmpty()
		}
		x.links = make(map[[24]byte]int32, t.Len())
		for i := t.Len() - 1; i >= 0; i-- {
			x.links[linkKey(t.At(i).TraceID(), t.At(i).SpanID())] = int32(i)
		}
	}
	k := linkKey(trace, span)
	if i, ok := x.links[k]; ok {
		return i
	}
	t := x.D.LinkTable()
	l := t.AppendEmpty()
	l.SetTraceID(trace)
	l.SetSpanID(span)
	i := int32(t.Len() - 1)
	x.links[k] = i
	return i
}

func linkKey(trace pcommon.TraceID, span pcommon.SpanID) (k [24]byte) {
	copy(k[:16], trace[:])
	copy(k[16:], span[:])
	return k
}
