package v8

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// errRefused: this V8 cannot be walked (a table missing or out of range).
var errRefused = errors.New("v8 not walkable")

// nameRE matches the files V8 lives in: node itself (V8 linked in) or
// libnode.so.N (Debian's nodejs).
var nameRE = regexp.MustCompile(`^(node|nodejs|libnode\.so(\.[0-9.]+)?)$`)

// candidate finds the mapping of p whose file holds V8.
func candidate(p *normalize.Process) *normalize.Mapping {
	var best *normalize.Mapping
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File == nil || m.Anonymous || !nameRE.MatchString(path.Base(m.Path)) {
			continue
		}
		if best == nil || strings.HasPrefix(path.Base(m.Path), "libnode") {
			best = m
		}
	}
	return best
}

// symBytecodeSizes is v8::internal::interpreter::Bytecodes::kBytecodeSizes.
const symBytecodeSizes = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE"

// Bounds on the symbol tables and FDE tables scanned (node's .symtab has
// ~110,000 symbols).
const maxSyms = 1 << 22

// fileInfo is what one V8 build says about itself: its v8dbg_* constants
// and where its embedded builtins are (ELF virtual addresses).
type fileInfo struct {
	consts     map[string]int64
	blobLo     uint64 // [blobLo, blobHi): the Builtins_* code
	blobHi     uint64
	blobFileLo uint64 // the blob's file offset
	// bytecodeSizes is V8's kBytecodeSizes (3 operand scales x the
	// bytecodes): baseline frames' lines need it; nil without .symtab.
	bytecodeSizes []byte
	err           error
}

// inspect reads the v8dbg_* constants from f's dynamic symbols and the
// builtins' range from its symbol table.
func inspect(f *elfx.File) *fileInfo {
	fi := &fileInfo{consts: map[string]int64{}}
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		fi.err = fmt.Errorf("%s: not an x86-64 ELF file: %w", f.Path, errRefused)
		return fi
	}
	lo, hi := ^uint64(0), uint64(0)
	for _, typ := range []elf.SectionType{elf.SHT_DYNSYM, elf.SHT_SYMTAB} {
		scanSymbols(f, typ, func(name []byte, typ elf.SymType, value, size uint64) {
			switch {
			case typ == elf.STT_OBJECT && bytes.HasPrefix(name, []byte("v8dbg_")) && size >= 4:
				if _, ok := fi.consts[string(name)]; ok {
					return
				}
				fi.consts[string(name)] = readConst(f, value)
			case typ == elf.STT_OBJECT && string(name) == symBytecodeSizes && size%3 == 0 && size > 0 && size <= 3*1024:
				if b, err := f.ReadVaddr(value, int(size)); err == nil {
					fi.bytecodeSizes = bytes.Clone(b)
				}
			case typ == elf.STT_FUNC && bytes.HasPrefix(name, []byte("Builtins_")) && size > 0 && value+size > value:
				lo, hi = min(lo, value), max(hi, value+size)
			}
		})
	}
	if len(fi.consts) == 0 {
		fi.err = fmt.Errorf("%s: no v8dbg_* symbols: %w", f.Path, errRefused)
		return fi
	}
	if hi <= lo || hi-lo > 1<<30 {
		// Stripped (Debian's libnode keeps only .dynsym, where no
		// Builtins_* are): the builtins are the code without unwind
		// information.
		var err error
		if lo, hi, err = blobFromFDEs(f); err != nil {
			fi.err = fmt.Errorf("%s: no Builtins_* symbols and %w: %w", f.Path, err, errRefused)
			return fi
		}
	}
	fi.blobLo, fi.blobHi = lo, hi
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && lo >= p.Vaddr && lo-p.Vaddr < p.Filesz {
			fi.blobFileLo = p.Off + lo - p.Vaddr
		}
	}
	return fi
}

// Bounds on the embedded builtins found without symbols: V8 10 to 13
// have 1.4 to 2.1 MB of them.
const (
	minBlob = 256 << 10
	maxBlob = 64 << 20
)

// blobFromFDEs finds the embedded builtins of a file without .symtab.
// The compiler writes an FDE for every C++ function (and the assembler
// for OpenSSL's and the like), while V8's embedded.S gives its builtins
// none: they are the one large stretch of .text no FDE covers. The
// stretch runs from the end of the C++ function before them to the start
// of the one after, so it holds padding besides the builtins, never
// code. It is refused unless it is alone of its size (the next largest
// at most a quarter of it) and no exported function lies in it.
func blobFromFDEs(f *elfx.File) (lo, hi uint64, err error) {
	text := f.Section(".text")
	if text == nil {
		return 0, 0, errors.New("no .text")
	}
	x, err := f.FDEs()
	if err != nil {
		return 0, 0, err
	}
	starts := x.Starts()
	if len(starts) > maxSyms {
		return 0, 0, fmt.Errorf("%d FDEs", len(starts))
	}
	var best, second [2]uint64
	end := text.Addr
	for _, s := range starts {
		if s >= text.Addr+text.Size {
			break
		}
		if s > end {
			g := [2]uint64{end, s}
			switch {
			case g[1]-g[0] > best[1]-best[0]:
				best, second = g, best
			case g[1]-g[0] > second[1]-second[0]:
				second = g
			}
		}
		if _, e, ok := x.Covering(s); ok && e > end {
			end = e
		}
	}
	size := best[1] - best[0]
	if size < minBlob || size > maxBlob || second[1]-second[0] > size/4 {
		return 0, 0, fmt.Errorf("no single stretch of code without unwind information (largest %d bytes, next %d)",
			size, second[1]-second[0])
	}
	inside := false
	scanSymbols(f, elf.SHT_DYNSYM, func(_ []byte, typ elf.SymType, value, _ uint64) {
		inside = inside || typ == elf.STT_FUNC && value >= best[0] && value < best[1]
	})
	if inside {
		return 0, 0, fmt.Errorf("an exported function in the stretch without unwind information %#x-%#x", best[0], best[1])
	}
	return best[0], best[1], nil
}

// readConst reads an int32 constant at vaddr; one in .bss (no file bytes)
// is zero, which is what V8 put there.
func readConst(f *elfx.File, vaddr uint64) int64 {
	b, err := f.ReadVaddr(vaddr, 4)
	if err != nil {
		return 0
	}
	return int64(int32(binary.LittleEndian.Uint32(b)))
}

// scanSymbols calls fn for each named symbol of f's table of type typ,
// without decoding the whole table (a hostile file named node may be
// anything).
func scanSymbols(f *elfx.File, typ elf.SectionType, fn func(name []byte, typ elf.SymType, value, size uint64)) {
	var tab *elf.Section
	for _, s := range f.Sections {
		if s.Type == typ {
			tab = s
			break
		}
	}
	if tab == nil || tab.Link == 0 || int(tab.Link) >= len(f.Sections) {
		return
	}
	strtab := f.Sections[tab.Link]
	data := f.Bytes()
	in := func(off, size uint64) bool { return off+size >= off && off+size <= uint64(len(data)) }
	if !in(tab.Offset, tab.Size) || !in(strtab.Offset, strtab.Size) || tab.Size/24 > maxSyms {
		return
	}
	syms := data[tab.Offset : tab.Offset+tab.Size]
	strs := data[strtab.Offset : strtab.Offset+strtab.Size]
	for off := 0; off+24 <= len(syms); off += 24 {
		e := syms[off : off+24]
		name := uint64(binary.LittleEndian.Uint32(e))
		if name == 0 || name >= uint64(len(strs)) {
			continue
		}
		s := strs[name:]
		i := bytes.IndexByte(s, 0)
		if i < 0 {
			continue
		}
		if binary.LittleEndian.Uint16(e[6:]) == uint16(elf.SHN_UNDEF) {
			continue
		}
		fn(s[:i], elf.SymType(e[4]&0xf), binary.LittleEndian.Uint64(e[8:]), binary.LittleEndian.Uint64(e[16:]))
	}
}
