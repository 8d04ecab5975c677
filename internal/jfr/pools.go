package jfr

import (
	"fmt"
)

// readPools follows the chunk's chain of constant-pool events from the
// header's offset. Each event points at the previous one with a negative
// delta; a chain that does not run strictly backwards (a cycle) is an error.
func (c *Chunk) readPools() error {
	c.strings = map[int64]str{}
	c.symbols = map[int64]str{}
	c.classes = map[int64]classEntry{}
	c.methods = map[int64]Method{}
	c.stacks = map[int64]*StackTrace{}
	c.threads = map[int64]threadEntry{}
	c.frameTypes = map[int64]str{}
	c.states = map[int64]str{}
	c.attrValues = map[int64]str{}
	pos := c.cpOffset
	for n := 0; ; n++ {
		if n >= c.opt.Limits.MaxCPEvents {
			return fmt.Errorf("more than %d constant-pool events: %w", c.opt.Limits.MaxCPEvents, ErrLimit)
		}
		d, _, typ, err := c.eventHeader(pos)
		if err != nil {
			return fmt.Errorf("constant pool: %w", err)
		}
		if typ != typeCPool {
			return fmt.Errorf("constant-pool chain reaches offset %d, an event of type %d: %w", pos, typ, ErrCorrupt)
		}
		d.i64() // start time
		d.i64() // duration
		delta := int64(d.i64())
		if c.major >= 2 {
			d.u8() // flush / checkpoint kind
		}
		if err := c.readPool(d); err != nil {
			return fmt.Errorf("constant pool at %d: %w", pos, err)
		}
		if delta == 0 {
			return nil
		}
		next := pos + delta
		if delta > 0 || next < headerSize {
			return fmt.Errorf("constant pool at %d links to %d: the chain must run backwards inside the chunk (cycle?): %w", pos, next, ErrCorrupt)
		}
		pos = next
	}
}

func (c *Chunk) readPool(d *decoder) error {
	pools := d.length("constant pools", 2, 1<<16)
	for i := 0; i < pools && d.err == nil; i++ {
		tid := int64(d.i64())
		cls := c.meta.classes[tid]
		if d.err != nil {
			break
		}
		if cls == nil {
			return fmt.Errorf("pool of undeclared type %d: %w", tid, ErrCorrupt)
		}
		n := d.length("constant-pool entry", 1+max(cls.minSize, 0), c.opt.Limits.MaxPoolEntries)
		c.entries += n
		if c.entries > c.opt.Limits.MaxPoolEntries {
			return fmt.Errorf("more than %d constant-pool entries: %w", c.opt.Limits.MaxPoolEntries, ErrLimit)
		}
		if n > 0 && cls.minSize == 0 && cls.kind == kindStruct {
			// Values of an empty type take no bytes; such a pool is only ids.
			for j := 0; j < n && d.err == nil; j++ {
				d.i64()
			}
			continue
		}
		read := c.poolReader(cls)
		for j := 0; j < n && d.err == nil; j++ {
			key := int64(d.i64())
			read(d, key)
		}
	}
	return d.err
}

// poolReader returns how entries of cls are read: into the typed tables for
// the types samples refer to, skipped otherwise.
func (c *Chunk) poolReader(cls *class) func(d *decoder, key int64) {
	switch cls.name {
	case "java.lang.String":
		if cls.kind == kindString {
			return func(d *decoder, key int64) { c.strings[key] = d.str() }
		}
	case "jdk.types.Symbol":
		return c.structReader(cls, func(key int64, v *fieldVals) { c.symbols[key] = v.str("string") })
	case "jdk.types.FrameType":
		return c.structReader(cls, func(key int64, v *fieldVals) { c.frameTypes[key] = v.str("description") })
	case "jdk.types.ThreadState":
		return c.structReader(cls, func(key int64, v *fieldVals) { c.states[key] = v.str("name") })
	case "profiler.types.AttributeValue":
		return c.structReader(cls, func(key int64, v *fieldVals) { c.attrValues[key] = v.str("value") })
	case "java.lang.Class":
		return c.structReader(cls, func(key int64, v *fieldVals) {
			c.classes[key] = classEntry{name: int64(v.num("name")), pkg: int64(v.num("package"))}
		})
	case "jdk.types.Method":
		return c.structReader(cls, func(key int64, v *fieldVals) {
			c.methods[key] = Method{Class: int64(v.num("type")), Name: int64(v.num("name")),
				Descriptor: int64(v.num("descriptor")), Modifiers: int32(v.num("modifiers")), Hidden: v.num("hidden") != 0}
		})
	case "java.lang.Thread":
		return c.structReader(cls, func(key int64, v *fieldVals) {
			c.threads[key] = threadEntry{osName: v.str("osName"), javaName: v.str("javaName"),
				osTID: int64(v.num("osThreadId")), javaTID: int64(v.num("javaThreadId"))}
		})
	case "jdk.types.StackTrace":
		return c.stackReader(cls)
	}
	return func(d *decoder, _ int64) { d.skipInline(cls, 0) }
}

// fieldVals holds the scalar and string fields of one struct value.
type fieldVals struct {
	cls  *class
	nums []uint64
	strs []str
}

func (v *fieldVals) index(name string) int {
	for i := range v.cls.fields {
		if v.cls.fields[i].name == name {
			return i
		}
	}
	return -1
}

func (v *fieldVals) num(name string) uint64 {
	if i := v.index(name); i >= 0 {
		return v.nums[i]
	}
	return 0
}

func (v *fieldVals) str(name string) str {
	if i := v.index(name); i >= 0 {
		return v.strs[i]
	}
	return str{}
}

// structReader reads struct values field by field: scalars and references
// as numbers, strings as strings, anything else skipped.
func (c *Chunk) structReader(cls *class, store func(key int64, v *fieldVals)) func(d *decoder, key int64) {
	v := &fieldVals{cls: cls, nums: make([]uint64, len(cls.fields)), strs: make([]str, len(cls.fields))}
	if cls.kind != kindStruct {
		return func(d *decoder, _ int64) { d.skipInline(cls, 0) }
	}
	return func(d *decoder, key int64) {
		for i := range cls.fields {
			f := &cls.fields[i]
			v.nums[i], v.strs[i] = 0, str{}
			if !f.array && !f.cpool && f.typ.kind == kindString {
				v.strs[i] = d.str()
				continue
			}
			v.nums[i], _ = d.scalar(f, 0)
		}
		if d.err == nil {
			store(key, v)
		}
	}
}

// stackReader reads jdk.types.StackTrace entries: a truncated flag and an
// array of inline jdk.types.StackFrame values.
func (c *Chunk) stackReader(cls *class) func(d *decoder, key int64) {
	framesField, truncField := -1, -1
	for i, f := range cls.fields {
		switch {
		case f.name == "frames" && f.array && !f.cpool && f.typ.kind == kindStruct:
			framesField = i
		case f.name == "truncated" && !f.array:
			truncField = i
		}
	}
	if framesField < 0 {
		return func(d *decoder, _ int64) { d.skipInline(cls, 0) }
	}
	fc := cls.fields[framesField].typ
	role := make([]int8, len(fc.fields)) // 0 skip, 1 method, 2 line, 3 bci, 4 type
	for i, f := range fc.fields {
		if f.array || !f.cpool && (f.typ.kind == kindStruct || f.typ.kind == kindString) {
			continue
		}
		switch f.name {
		case "method":
			role[i] = 1
		case "lineNumber":
			role[i] = 2
		case "bytecodeIndex":
			role[i] = 3
		case "type":
			role[i] = 4
		}
	}
	minFrame := max(fc.minSize, 1)
	return func(d *decoder, key int64) {
		st := &StackTrace{}
		for i := range cls.fields {
			f := &cls.fields[i]
			switch i {
			case truncField:
				v, _ := d.scalar(f, 0)
				st.Truncated = v != 0
			case framesField:
				n := d.length("stack frame", minFrame, c.opt.Limits.MaxArrayLen)
				if n > 0 && fc.minSize == 0 {
					d.corrupt("stack frames of the empty type %s", fc.name)
					return
				}
				st.Frames = make([]Frame, n)
				for j := 0; j < n && d.err == nil; j++ {
					fr := &st.Frames[j]
					for k := range fc.fields {
						ff := &fc.fields[k]
						if role[k] == 0 {
							d.skipField(ff, 1)
							continue
						}
						x, _ := d.scalar(ff, 1)
						switch role[k] {
						case 1:
							fr.Method = int64(x)
						case 2:
							fr.Line = int32(x)
						case 3:
							fr.BCI = int32(x)
						case 4:
							fr.Type = int64(x)
						}
					}
				}
			default:
				d.skipField(f, 0)
			}
		}
		if d.err == nil {
			c.stacks[key] = st
		}
	}
}

// resolve returns a string value, following one reference into the
// java.lang.String pool (a reference to a reference resolves to "").
func (c *Chunk) resolve(s str) string {
	if !s.isRef {
		return s.s
	}
	t, ok := c.strings[s.ref]
	if !ok || t.isRef {
		return ""
	}
	return t.s
}

// Stack returns the stack trace with constant-pool id id.
func (c *Chunk) Stack(id int64) (*StackTrace, bool) {
	st, ok := c.stacks[id]
	return st, ok
}

// Method returns the method with constant-pool id id.
func (c *Chunk) Method(id int64) (Method, bool) {
	m, ok := c.methods[id]
	return m, ok
}

// Symbol returns the symbol with constant-pool id id ("" when absent).
func (c *Chunk) Symbol(id int64) string { return c.resolve(c.symbols[id]) }

// ClassName returns the name of class id as recorded (internal form, with
// slashes: "java/lang/String"; "" when absent).
func (c *Chunk) ClassName(id int64) string {
	e, ok := c.classes[id]
	if !ok {
		return ""
	}
	return c.Symbol(e.name)
}

// FrameType returns the description of frame type id in the chunk's
// FrameType pool; ok is false for ids the pool does not list (the Datadog
// profiler's remote native frames use 7, which it never lists).
func (c *Chunk) FrameType(id int64) (string, bool) {
	s, ok := c.frameTypes[id]
	if !ok {
		return "", false
	}
	return c.resolve(s), true
}

// HasFrameType tells whether the chunk's FrameType pool lists desc. The
// JDK's lists Interpreted, JIT compiled, Inlined and Native (Java native
// methods); async-profiler's and the Datadog profiler's also list C++ and
// Kernel, and their "Native" frames are C functions.
func (c *Chunk) HasFrameType(desc string) bool {
	for _, s := range c.frameTypes {
		if c.resolve(s) == desc {
			return true
		}
	}
	return false
}

// HasThreadState tells whether the chunk's ThreadState pool lists name.
// async-profiler's lists STATE_DEFAULT, the state of its CPU samples; the
// JDK's never does.
func (c *Chunk) HasThreadState(name string) bool {
	for _, s := range c.states {
		if c.resolve(s) == name {
			return true
		}
	}
	return false
}

// AttributeValue returns context-attribute value id ("" when absent).
func (c *Chunk) AttributeValue(id int64) string { return c.resolve(c.attrValues[id]) }

// ThreadState returns the name of thread state id ("" when absent).
func (c *Chunk) ThreadState(id int64) string { return c.resolve(c.states[id]) }

// Thread returns the thread with constant-pool id id.
func (c *Chunk) Thread(id int64) (Thread, bool) {
	t, ok := c.threads[id]
	if !ok {
		return Thread{}, false
	}
	return Thread{OSName: c.resolve(t.osName), OSThreadID: t.osTID, JavaName: c.resolve(t.javaName), JavaThreadID: t.javaTID}, true
}
