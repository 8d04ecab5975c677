package hotspot

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// A Java method's name, file and line table, read from its Method,
// ConstMethod, ConstantPool and class (method.hpp, constMethod.hpp):
//
//   Method        -> ConstMethod (_constMethod)
//   ConstMethod   -> ConstantPool (_constants), name and signature indexes,
//                    flags, code size; the bytecodes follow the header, and
//                    the compressed line number table follows them
//   ConstantPool  -> the holder class (_pool_holder), the source file's
//                    index (15+; InstanceKlass before); entries follow the
//                    header, 8 bytes each, a Symbol* for names
//   Klass         -> Symbol _name ("java/lang/String")
//   Symbol        -> u16 length, then the bytes (modified UTF-8)

// maxLineTable bounds the bytes of one line number table kept (about a
// thousand entries; real methods have tens).
const maxLineTable = 4096

// methodInfo is what naming a method's frames needs.
type methodInfo struct {
	cm    uint64 // the ConstMethod it was read from: its identity
	name  string // package.Class.method, as the jfr receiver names JFR frames
	file  string // source file name ("Hot.java"); empty when unknown
	lines []byte // compressed line number table, nil when none
	code  int    // bytecode size
}

func (m *methodInfo) cost() int64 { return int64(96 + len(m.name) + len(m.file) + len(m.lines)) }

// frame is the method's frame at bci (-1: unknown).
func (m *methodInfo) frame(l *layout, bci int) frame.Frame {
	f := frame.Frame{Name: m.name, File: m.file}
	if bci >= 0 && bci < m.code && m.lines != nil {
		f.Line = uint32(lineFor(m.lines, l.u5x(), bci))
	}
	return f
}

// u5x is the UNSIGNED5 excluded-byte count of this JDK.
func (l *layout) u5x() byte {
	if l.version >= 20 {
		return 1
	}
	return 0
}

// readMethod reads the method at addr of process pr.
func (pr *proc) readMethod(addr uint64, maxName int) (*methodInfo, error) {
	l := pr.l
	if addr == 0 || addr&7 != 0 {
		return nil, fmt.Errorf("Method* %#x: %w", addr, runtimes.ErrBadFrame)
	}
	cm, err := pr.mem.U64(addr + l.methodConst)
	if err != nil {
		return nil, err
	}
	if cm == 0 || cm&7 != 0 {
		return nil, fmt.Errorf("ConstMethod* %#x: %w", cm, runtimes.ErrBadFrame)
	}
	hdr := make([]byte, l.constMethodSize)
	if err := pr.mem.Read(cm, hdr); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	cp := le.Uint64(hdr[l.cmConstants:])
	nameIdx := le.Uint16(hdr[l.cmNameIndex:])
	flags := le.Uint16(hdr[l.cmFlags:]) // the flags used here sit in the low half
	codeSize := int(le.Uint16(hdr[l.cmCodeSize:]))
	if cp == 0 || cp&7 != 0 {
		return nil, fmt.Errorf("ConstantPool* %#x: %w", cp, runtimes.ErrBadFrame)
	}
	cph := make([]byte, l.cpSize)
	if err := pr.mem.Read(cp, cph); err != nil {
		return nil, err
	}
	holder := le.Uint64(cph[l.cpHolder:])
	cpLen := le.Uint32(cph[l.cpLength:])
	if holder == 0 || holder&7 != 0 || cpLen > 1<<16 {
		return nil, fmt.Errorf("class %#x, pool of %d: %w", holder, cpLen, runtimes.ErrBadFrame)
	}
	m := &methodInfo{cm: cm, code: codeSize}
	pool := func(i uint16) (string, error) {
		if i == 0 || uint32(i) >= cpLen {
			return "", fmt.Errorf("pool index %d of %d: %w", i, cpLen, runtimes.ErrBadFrame)
		}
		sym, err := pr.mem.U64(cp + l.cpSize + 8*uint64(i))
		if err != nil {
			return "", err
		}
		return pr.symbol(sym&^1, maxName)
	}
	method, err := pool(nameIdx)
	if err != nil {
		return nil, err
	}
	klassSym, err := pr.mem.U64(holder + l.klassName)
	if err != nil {
		return nil, err
	}
	class, err := pr.symbol(klassSym, maxName)
	if err != nil {
		return nil, err
	}
	m.name = frame.JavaMethod(class, method)
	if len(m.name) > maxName {
		m.name = cut(m.name, maxName)
	}
	var fileIdx uint16
	if l.cpSourceFile != 0 {
		fileIdx = le.Uint16(cph[l.cpSourceFile:])
	} else if fileIdx, err = pr.mem.U16(holder + l.ikSourceFile); err != nil {
		return nil, err
	}
	if fileIdx != 0 {
		// A class without a SourceFile attribute (generated code) has
		// none: the frame keeps its name, without a file.
		m.file, _ = pool(fileIdx)
	}
	if uint64(flags)&l.cmHasLineTable != 0 && codeSize > 0 {
		m.lines = pr.lineTable(cm + l.constMethodSize + uint64(codeSize))
	}
	return m, nil
}

// lineTable reads the compressed line number table at addr: a first read
// of 256 bytes holds most, a longer one is read once more up to
// maxLineTable. nil when it does not end within that.
func (pr *proc) lineTable(addr uint64) []byte {
	x := pr.l.u5x()
	for _, n := range []int{256, maxLineTable} {
		b := make([]byte, n)
		if err := pr.mem.Read(addr, b); err != nil {
			// The table may end near the end of a mapping: up to
			// the page's end.
			n = int(pageSize - addr%pageSize)
			if n >= len(b) || pr.mem.Read(addr, b[:n]) != nil {
				return nil
			}
			b = b[:n]
		}
		if end := lineTableEnd(b, x); end > 0 {
			return append([]byte(nil), b[:end]...)
		}
	}
	return nil
}

// symbol reads a Symbol's bytes, at most max of them.
func (pr *proc) symbol(addr uint64, max int) (string, error) {
	l := pr.l
	if addr == 0 || addr&7 != 0 {
		return "", fmt.Errorf("Symbol* %#x: %w", addr, runtimes.ErrBadFrame)
	}
	var hdr [64]byte
	n := int(l.symBody) + 48
	if err := pr.mem.Read(addr, hdr[:n]); err != nil {
		return "", err
	}
	size := int(binary.LittleEndian.Uint16(hdr[l.symLength:]))
	if size == 0 {
		return "", fmt.Errorf("empty Symbol at %#x: %w", addr, runtimes.ErrBadFrame)
	}
	cutAt := min(size, max)
	var b []byte
	if int(l.symBody)+cutAt <= n {
		b = hdr[l.symBody : int(l.symBody)+cutAt]
	} else {
		b = make([]byte, cutAt)
		if err := pr.mem.Read(addr+l.symBody, b); err != nil {
			return "", err
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if size > max {
		s = cut(s, max)
	}
	return s, nil
}

// cut shortens s to at most max bytes on a UTF-8 boundary, ending in
// "...", as the processor cuts names.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max - 3
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
