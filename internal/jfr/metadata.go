package jfr

import (
	"fmt"
	"strconv"
)

// kind is how a value of a type is encoded.
type kind uint8

const (
	kindStruct kind = iota // fields in order (or a type with no fields)
	kindBool
	kindByte
	kindChar
	kindShort
	kindInt
	kindLong
	kindFloat
	kindDouble
	kindString
)

var primitives = map[string]kind{
	"boolean": kindBool, "byte": kindByte, "char": kindChar, "short": kindShort,
	"int": kindInt, "long": kindLong, "float": kindFloat, "double": kindDouble,
	"java.lang.String": kindString,
}

// class is a type declared by the chunk's metadata.
type class struct {
	id     int64
	name   string
	super  string
	kind   kind
	fields []field
	// minSize is the fewest bytes a value of this type takes inline, so that
	// a declared array length can be checked against the bytes left.
	minSize int
	// skip lists the fields that take bytes: fields of empty inline types
	// are left out, so skipping costs at most a few steps per byte read
	// (a type nesting thousands of empty fields cannot burn CPU).
	skip []field
}

type field struct {
	name   string
	typeID int64
	typ    *class
	cpool  bool // the value is a constant-pool reference (a varint)
	array  bool
}

// metadata is the chunk's type system.
type metadata struct {
	classes map[int64]*class
	byName  map[string]*class
}

// Names of the elements and attributes of the metadata tree.
const (
	elemClass = "class"
	elemField = "field"
)

// element is one node of the metadata tree, only as much of it as the
// parser needs.
type element struct {
	name     string
	attrs    map[string]string
	children []*element
}

// maxMetadataDepth bounds the nesting of the metadata tree (JDK's is 4).
const maxMetadataDepth = 16

// readMetadata parses the metadata event whose fields start at d.pos (after
// size, type, start time, duration and metadata id).
func readMetadata(d *decoder) (*metadata, error) {
	n := d.length("metadata string", 1, d.lim.MaxPoolEntries)
	if d.err != nil {
		return nil, fmt.Errorf("metadata: %w", d.err)
	}
	strs := make([]string, n)
	for i := range strs {
		s := d.str()
		if s.isRef {
			d.corrupt("metadata string %d refers to a constant pool", i)
		}
		strs[i] = s.s
	}
	if d.err != nil {
		return nil, fmt.Errorf("metadata: %w", d.err)
	}
	elems := 0
	root := readElement(d, strs, 0, &elems)
	if d.err != nil {
		return nil, fmt.Errorf("metadata: %w", d.err)
	}
	m := &metadata{classes: map[int64]*class{}, byName: map[string]*class{}}
	var classElems []*element
	var walk func(e *element)
	walk = func(e *element) {
		for _, c := range e.children {
			if c.name == elemClass {
				classElems = append(classElems, c)
			} else {
				walk(c)
			}
		}
	}
	walk(root)
	if len(classElems) > d.lim.MaxClasses {
		return nil, fmt.Errorf("metadata: %d classes over the limit %d: %w", len(classElems), d.lim.MaxClasses, ErrLimit)
	}
	for _, ce := range classElems {
		id, err := strconv.ParseInt(ce.attrs["id"], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("metadata: class %q has id %q: %w", ce.attrs["name"], ce.attrs["id"], ErrCorrupt)
		}
		c := &class{id: id, name: ce.attrs["name"], super: ce.attrs["superType"]}
		if k, ok := primitives[c.name]; ok {
			c.kind = k
		}
		for _, fe := range ce.children {
			if fe.name != elemField {
				continue
			}
			tid, err := strconv.ParseInt(fe.attrs["class"], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("metadata: field %s.%s has type %q: %w", c.name, fe.attrs["name"], fe.attrs["class"], ErrCorrupt)
			}
			dim := fe.attrs["dimension"]
			if dim != "" && dim != "0" && dim != "1" {
				return nil, fmt.Errorf("metadata: field %s.%s has dimension %s: %w", c.name, fe.attrs["name"], dim, ErrCorrupt)
			}
			c.fields = append(c.fields, field{name: fe.attrs["name"], typeID: tid,
				cpool: fe.attrs["constantPool"] == "true", array: dim == "1"})
		}
		if c.kind != kindStruct && len(c.fields) > 0 {
			return nil, fmt.Errorf("metadata: primitive %s declares fields: %w", c.name, ErrCorrupt)
		}
		if _, dup := m.classes[id]; dup {
			return nil, fmt.Errorf("metadata: class id %d declared twice: %w", id, ErrCorrupt)
		}
		m.classes[id] = c
		if c.name != "" {
			m.byName[c.name] = c
		}
	}
	for _, c := range m.classes {
		for i := range c.fields {
			f := &c.fields[i]
			f.typ = m.classes[f.typeID]
			if f.typ == nil {
				return nil, fmt.Errorf("metadata: field %s.%s has undeclared type %d: %w", c.name, f.name, f.typeID, ErrCorrupt)
			}
		}
	}
	// Types are laid out inline unless referenced through a constant pool;
	// a type that contains itself inline has no finite encoding.
	state := map[*class]uint8{}
	for _, c := range m.classes {
		if err := m.size(c, state, 0); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// size computes c.minSize, rejecting types that contain themselves inline.
func (m *metadata) size(c *class, state map[*class]uint8, depth int) error {
	switch state[c] {
	case 1:
		return fmt.Errorf("metadata: type %s contains itself inline: %w", c.name, ErrCorrupt)
	case 2:
		return nil
	}
	if depth > maxMetadataDepth*4 {
		return fmt.Errorf("metadata: types nested deeper than %d: %w", maxMetadataDepth*4, ErrLimit)
	}
	state[c] = 1
	switch c.kind {
	case kindBool, kindByte, kindString:
		c.minSize = 1
	case kindFloat:
		c.minSize = 4
	case kindDouble:
		c.minSize = 8
	case kindChar, kindShort, kindInt, kindLong:
		c.minSize = 1 // compressed; uncompressed is larger, 1 stays a safe bound
	default:
		for _, f := range c.fields {
			switch {
			case f.array, f.cpool:
				c.minSize++
			default:
				if err := m.size(f.typ, state, depth+1); err != nil {
					return err
				}
				c.minSize += f.typ.minSize
			}
		}
	}
	state[c] = 2
	c.skip = c.skip[:0]
	for _, f := range c.fields {
		if !f.array && !f.cpool && f.typ.kind == kindStruct && f.typ.minSize == 0 {
			continue
		}
		c.skip = append(c.skip, f)
	}
	return nil
}

func readElement(d *decoder, strs []string, depth int, count *int) *element {
	if depth > maxMetadataDepth {
		d.fail(fmt.Errorf("metadata nested deeper than %d: %w", maxMetadataDepth, ErrLimit))
		return nil
	}
	*count++
	if *count > d.lim.MaxPoolEntries {
		d.fail(fmt.Errorf("metadata has more than %d elements: %w", d.lim.MaxPoolEntries, ErrLimit))
		return nil
	}
	e := &element{name: strAt(d, strs, d.i32())}
	na := d.length("metadata attribute", 2, 1<<16)
	if na > 0 {
		e.attrs = make(map[string]string, na)
	}
	for i := 0; i < na && d.err == nil; i++ {
		k := strAt(d, strs, d.i32())
		e.attrs[k] = strAt(d, strs, d.i32())
	}
	nc := d.length("metadata element", 3, d.lim.MaxPoolEntries)
	for i := 0; i < nc && d.err == nil; i++ {
		e.children = append(e.children, readElement(d, strs, depth+1, count))
	}
	return e
}

func strAt(d *decoder, strs []string, i uint64) string {
	if i >= uint64(len(strs)) {
		if d.err == nil {
			d.corrupt("metadata string index %d of %d", i, len(strs))
		}
		return ""
	}
	return strs[i]
}

// skip skips one value of field f.
func (d *decoder) skipField(f *field, depth int) {
	if f.array {
		n := d.length("array", max(f.elemMin(), 1), d.lim.MaxArrayLen)
		if n > 0 && f.elemMin() == 0 {
			d.corrupt("array of %d values of the empty type %s", n, f.typ.name)
			return
		}
		for i := 0; i < n && d.err == nil; i++ {
			d.skipValue(f, depth)
		}
		return
	}
	d.skipValue(f, depth)
}

func (f *field) elemMin() int {
	if f.cpool {
		return 1
	}
	return f.typ.minSize
}

func (d *decoder) skipValue(f *field, depth int) {
	if f.cpool {
		d.i64()
		return
	}
	d.skipInline(f.typ, depth)
}

func (d *decoder) skipInline(c *class, depth int) {
	switch c.kind {
	case kindBool, kindByte:
		d.u8()
	case kindChar, kindShort:
		d.i16()
	case kindInt:
		d.i32()
	case kindLong:
		d.i64()
	case kindFloat:
		d.fixed(4)
	case kindDouble:
		d.fixed(8)
	case kindString:
		d.skipStr()
	default:
		if depth > maxMetadataDepth*4 {
			d.fail(fmt.Errorf("values nested deeper than %d: %w", maxMetadataDepth*4, ErrLimit))
			return
		}
		for i := range c.skip {
			if d.err != nil {
				return
			}
			d.skipField(&c.skip[i], depth+1)
		}
	}
}

// scalar reads a value of a field whose type is a primitive or that is a
// constant-pool reference, as a uint64 (floats as their IEEE bits). ok is
// false for strings, inline structs and arrays, which it skips.
func (d *decoder) scalar(f *field, depth int) (v uint64, ok bool) {
	if f.array {
		d.skipField(f, depth)
		return 0, false
	}
	if f.cpool {
		return d.i64(), true
	}
	switch f.typ.kind {
	case kindBool, kindByte:
		return uint64(d.u8()), true
	case kindChar, kindShort:
		return d.i16(), true
	case kindInt:
		return d.i32(), true
	case kindLong:
		return d.i64(), true
	case kindFloat:
		return d.fixed(4), true
	case kindDouble:
		return d.fixed(8), true
	}
	d.skipInline(f.typ, depth)
	return 0, false
}
