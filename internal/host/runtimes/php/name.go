package php

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// memory is a process's memory (runtimes.Mem; a fake one in fuzz tests).
// What it returns is whatever the process put there.
type memory interface {
	Read(addr uint64, p []byte) error
	U64(addr uint64) (uint64, error)
}

// Function types (zend_function.type).
const (
	typeInternal = uint8(bpf.ProfilePhpFuncTypePHP_INTERNAL_FUNCTION)
	typeUser     = uint8(bpf.ProfilePhpFuncTypePHP_USER_FUNCTION)
	typeEval     = uint8(bpf.ProfilePhpFuncTypePHP_EVAL_CODE)
)

// mainName names the code of a file outside any function: the script's
// body, an included file's.
const mainName = "{main}"

// funcInfo is what naming one function's frames needs.
type funcInfo struct {
	name, file string
	first      uint32
	builtin    bool
}

func (f *funcInfo) cost() int64 { return int64(len(f.name)+len(f.file)) + 64 }

// funcID is the hash the BPF walker records beside a function
// (php_func_id in bpf/php.h).
func funcID(typ uint8, name, scope, filename uint64, lineStart uint32) uint32 {
	if typ == typeInternal {
		return runtimes.ObjectID(uint64(typ), name, scope)
	}
	return runtimes.ObjectID(uint64(typ), name, scope, filename, uint64(lineStart))
}

// mainID is the id the BPF walker records beside a {main} frame's
// filename string (php_main_id in bpf/php.h).
func mainID(str, hash, length uint64) uint32 {
	return runtimes.ObjectID(uint64(FrameKindMain), str, hash, length)
}

// readMain names a {main} frame from the filename zend_string at addr. want
// is the id the walker recorded: a string with another hash or length is
// not the one sampled (freed and its memory reused), ErrBadFrame.
func readMain(m memory, l *layout, addr uint64, want uint32, maxName int) (*funcInfo, error) {
	hash, err := m.U64(addr + uint64(l.strHash))
	if err != nil {
		return nil, err
	}
	n, err := m.U64(addr + uint64(l.strLen))
	if err != nil {
		return nil, err
	}
	if mainID(addr, hash, n) != want {
		return nil, fmt.Errorf("file name %#x replaced since it was sampled: %w", addr, runtimes.ErrBadFrame)
	}
	file, err := readString(m, l, addr, maxName)
	if err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
		return nil, fmt.Errorf("file name %#x: %w", addr, err)
	}
	return &funcInfo{name: mainName, file: file}, nil
}

// maxFuncRead bounds one read of a zend_function.
const maxFuncRead = int(bpf.ProfilePhpLimitsPHP_FUNC_READ)

// readFunc reads the zend_function at addr. want is the function id the
// walker recorded (0: none): a function with another id is not the one
// that ran (freed at the end of its request and its memory reused), and
// fails with ErrBadFrame.
func readFunc(m memory, l *layout, addr uint64, want uint32, maxName int) (*funcInfo, error) {
	var hdr [maxFuncRead]byte
	n := int(l.fnSize())
	if n > len(hdr) {
		return nil, fmt.Errorf("function fields past %d bytes: %w", len(hdr), errLayout)
	}
	common := int(bpf.ProfilePhpLimitsPHP_FUNC_COMMON)
	if err := m.Read(addr, hdr[:n]); err != nil {
		// A built-in's structure is shorter: its common part is all
		// there is to read (as the walker does).
		if err2 := m.Read(addr, hdr[:common]); err2 != nil {
			return nil, err
		}
		n = common
	}
	typ := hdr[0]
	nameP := le64(hdr[:], l.fnName)
	scopeP := le64(hdr[:], l.fnScope)
	var fileP uint64
	var first uint32
	switch typ {
	case typeInternal:
	case typeUser, typeEval:
		if n < int(l.fnSize()) {
			return nil, fmt.Errorf("user function %#x unreadable past %d bytes: %w", addr, n, runtimes.ErrBadFrame)
		}
		fileP = le64(hdr[:], l.fnFilename)
		first = binary.LittleEndian.Uint32(hdr[l.fnLineStart:])
	default:
		return nil, fmt.Errorf("%#x is no function (type %d): %w", addr, typ, runtimes.ErrBadFrame)
	}
	if id := funcID(typ, nameP, scopeP, fileP, first); want != 0 && id != want {
		return nil, fmt.Errorf("function %#x replaced since it was sampled: %w", addr, runtimes.ErrBadFrame)
	}
	fi := &funcInfo{first: first, builtin: typ == typeInternal}
	name, err := readString(m, l, nameP, maxName)
	switch {
	case nameP == 0 && typ == typeInternal:
		return nil, fmt.Errorf("built-in function %#x without a name: %w", addr, runtimes.ErrBadFrame)
	case nameP == 0:
		name = mainName
	case err != nil && !errors.Is(err, frame.ErrLimitExceeded):
		return nil, fmt.Errorf("function %#x name: %w", addr, err)
		// A name cut at maxName is still its name.
	}
	if scopeP != 0 {
		ceName, err := m.U64(scopeP + uint64(l.ceName))
		if err != nil {
			return nil, fmt.Errorf("function %#x class: %w", addr, err)
		}
		class, err := readString(m, l, ceName, maxName)
		if err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
			return nil, fmt.Errorf("function %#x class name: %w", addr, err)
		}
		name = class + "::" + name
	}
	fi.name = cut(name, maxName)
	if fileP != 0 {
		file, err := readString(m, l, fileP, maxName)
		if err != nil && !errors.Is(err, frame.ErrLimitExceeded) {
			return nil, fmt.Errorf("function %#x file: %w", addr, err)
		}
		fi.file = file
	}
	return fi, nil
}

// maxString bounds a zend_string's length as read: a longer one is
// hostile or freed memory.
const maxString = 1 << 20

// isString is zend_string's type (IS_STRING) in the low bits of its
// gc.u.type_info.
const isString, gcTypeMask = 6, 0x0f

// readString reads a zend_string of at most limit bytes (cut there, with
// frame.ErrLimitExceeded). Memory that is no string (freed: ZendMM keeps
// its free list in the first word, where the type is) is a bad frame, not
// a name.
func readString(m memory, l *layout, addr uint64, limit int) (string, error) {
	if addr == 0 {
		return "", fmt.Errorf("no string: %w", runtimes.ErrBadFrame)
	}
	var hdr [4]byte
	if err := m.Read(addr+uint64(l.strType), hdr[:]); err != nil {
		return "", err
	}
	if typ := binary.LittleEndian.Uint32(hdr[:]) & gcTypeMask; typ != isString {
		return "", fmt.Errorf("%#x is no string (type %d): %w", addr, typ, runtimes.ErrBadFrame)
	}
	n, err := m.U64(addr + uint64(l.strLen))
	if err != nil {
		return "", err
	}
	if n > maxString {
		return "", fmt.Errorf("string at %#x of %d bytes: %w", addr, n, runtimes.ErrBadFrame)
	}
	var cutErr error
	if n > uint64(limit) {
		n = uint64(limit)
		cutErr = fmt.Errorf("string at %#x longer than %d bytes: %w", addr, limit, frame.ErrLimitExceeded)
	}
	b := make([]byte, n)
	if n > 0 {
		if err := m.Read(addr+uint64(l.strVal), b); err != nil {
			return "", err
		}
	}
	s := string(b)
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return s, cutErr
}

// cut keeps at most limit bytes of s, on a rune boundary.
func cut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	i := limit
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

func le64(b []byte, off uint16) uint64 {
	if int(off)+8 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}
