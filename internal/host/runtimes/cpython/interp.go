package cpython

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// nameRE matches the files an interpreter lives in: the executable
// (python3, python3.11) or the library (libpython3.11.so.1.0); a suffix
// letter is an ABI flag (3.13t: free-threaded, 3.9d: debug, 3.7m: pymalloc).
var nameRE = regexp.MustCompile(`^(lib)?python3(?:\.(\d{1,2}))?([a-z]*)(?:\.so(?:\.[0-9.]+)?)?$`)

// candidate is a mapping that may hold the interpreter.
type candidate struct {
	m     *normalize.Mapping
	minor int // from the name, 0 when it has none
	flags string
	lib   bool
}

// findCandidate picks the mapping of p whose file is a Python interpreter
// by its name: the library when the executable links one.
func findCandidate(p *normalize.Process) (candidate, bool) {
	var best candidate
	found := false
	for i := range p.Mappings {
		m := &p.Mappings[i]
		if m.File == nil || m.Anonymous {
			continue
		}
		sm := nameRE.FindStringSubmatch(path.Base(m.Path))
		if sm == nil {
			continue
		}
		c := candidate{m: m, flags: sm[3], lib: sm[1] != ""}
		c.minor, _ = strconv.Atoi(sm[2])
		if !found || c.lib && !best.lib {
			best, found = c, true
		}
	}
	return best, found
}

// fileInfo is what one interpreter build says about itself, read from its
// ELF file once per file version. Addresses are the file's own (ELF
// virtual addresses).
type fileInfo struct {
	shim  bool // an executable that links libpython: the interpreter is there
	minor int
	lay   layout
	err   error // why its Python frames cannot be walked (its eval loop may still be known)

	runtime, codeType, frameType, unicodeType, bytesType uint64
	eval, cold                                           [2]uint64 // [lo, hi); cold is zero when not split
	coldFrom                                             string    // how the cold part was found
}

// Symbols an interpreter exports in .dynsym (the eval loop's .cold part is
// a local symbol: .symtab only).
const (
	symRuntime  = "_PyRuntime"
	symEval     = "_PyEval_EvalFrameDefault"
	symEvalCold = "_PyEval_EvalFrameDefault.cold"
	symCodeType = "PyCode_Type"
	symFrame    = "PyFrame_Type"
	symUnicode  = "PyUnicode_Type"
	symBytes    = "PyBytes_Type"
	symVersion  = "Py_Version"
	// 3.6 has no _PyRuntime: its interpreter list starts at interp_head,
	// a local symbol, whose address PyInterpreterState_Head loads.
	symInterpHead     = "interp_head"
	symInterpHeadFunc = "PyInterpreterState_Head"
)

// openTimeout bounds opening an interpreter file.
const openTimeout = 10 * time.Second

// readFile inspects the interpreter file of c, opened through the
// process's own view of the file system. An error is a failure to open it
// there, which says nothing of the file: the process may be exiting (a
// short-lived python's /proc entries go first), or the host busy.
func readFile(procDir string, c candidate) (*fileInfo, error) {
	f, err := openFile(procDir, c)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return inspect(f, c), nil
}

func openFile(procDir string, c candidate) (*elfx.File, error) {
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(procDir, c.m.Start, c.m.End, c.m.Path) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		f, oerr := elfx.OpenContext(ctx, pth, elfx.Limits{})
		cancel()
		if oerr == nil {
			return f, nil
		}
		err = oerr
	}
	return nil, fmt.Errorf("opening %s: %w", c.m.Path, err)
}

// hostMachine is the ELF machine of the interpreters walked on each
// architecture: the walker reads the sampled thread's own registers.
var hostMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// inspect reads an interpreter's symbols, version, eval loop and layout.
func inspect(f *elfx.File, c candidate) *fileInfo {
	fi := &fileInfo{minor: c.minor}
	if f.Machine != hostMachine[runtime.GOARCH] || f.Class != elf.ELFCLASS64 {
		fi.err = fmt.Errorf("%s on %s: %w", c.m.Path, f.Machine, errUnsupported)
		return fi
	}
	if !c.lib {
		needed, _ := f.DynString(elf.DT_NEEDED)
		for _, n := range needed {
			if sm := nameRE.FindStringSubmatch(n); sm != nil && sm[1] != "" {
				fi.shim = true
				return fi
			}
		}
	}
	syms := map[string]elf.Symbol{}
	want := map[string]bool{symRuntime: true, symEval: true, symEvalCold: true, symCodeType: true,
		symFrame: true, symUnicode: true, symBytes: true, symVersion: true, symInterpHead: true, symInterpHeadFunc: true}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		ss, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			fi.err = fmt.Errorf("%s symbols: %w", c.m.Path, err)
			return fi
		}
		for _, s := range ss {
			if want[s.Name] && s.Value != 0 {
				if _, dup := syms[s.Name]; !dup {
					syms[s.Name] = s
				}
			}
		}
	}
	ev, ok := syms[symEval]
	if !ok || ev.Size == 0 {
		fi.err = fmt.Errorf("%s: no %s: %w", c.m.Path, symEval, errUnsupported)
		return fi
	}
	fi.eval = [2]uint64{ev.Value, ev.Value + ev.Size}
	if cs, ok := syms[symEvalCold]; ok && cs.Size > 0 {
		fi.cold, fi.coldFrom = [2]uint64{cs.Value, cs.Value + cs.Size}, "symtab"
	} else if s, e, ok, err := coldRange(f, fi.eval[0], fi.eval[1]); ok {
		fi.cold, fi.coldFrom = [2]uint64{s, e}, "jumps"
	} else if err != nil {
		fi.coldFrom = "none: " + err.Error()
	}
	if v, ok := syms[symVersion]; ok {
		b, err := f.ReadVaddr(v.Value, 8)
		if err != nil {
			fi.err = fmt.Errorf("%s: reading Py_Version: %w", c.m.Path, err)
			return fi
		}
		hex := binary.LittleEndian.Uint64(b)
		minor := int(hex >> 16 & 0xff)
		if hex>>24 != 3 || c.minor != 0 && minor != c.minor {
			fi.err = fmt.Errorf("%s: Py_Version %#x: %w", c.m.Path, hex, errLayout)
			return fi
		}
		fi.minor = minor
	}
	switch {
	case fi.minor == 0:
		fi.err = fmt.Errorf("%s: no version in its name or symbols: %w", c.m.Path, errUnsupported)
		return fi
	case c.flags != "" && (c.flags != "m" || fi.minor > 7):
		// "m" (pymalloc) is the default build of 3.7 and older, dropped in 3.8.
		fi.err = fmt.Errorf("%s: ABI flags %q (free-threaded or debug build): %w", c.m.Path, c.flags, errUnsupported)
		return fi
	}
	if fi.minor == 6 {
		head, err := interpHead(f, syms)
		if err != nil {
			fi.err = fmt.Errorf("%s: %w", c.m.Path, err)
			return fi
		}
		syms[symRuntime] = elf.Symbol{Name: symRuntime, Value: head}
	}
	for name, dst := range map[string]*uint64{symRuntime: &fi.runtime, symCodeType: &fi.codeType,
		symUnicode: &fi.unicodeType, symBytes: &fi.bytesType, symFrame: &fi.frameType} {
		s, ok := syms[name]
		if !ok {
			fi.err = fmt.Errorf("%s: no %s: %w", c.m.Path, name, errUnsupported)
			return fi
		}
		*dst = s.Value
	}
	if fi.minor >= 13 {
		b, err := f.ReadVaddr(fi.runtime, debugOffsetsSize)
		if err != nil {
			fi.err = fmt.Errorf("%s: reading _Py_DebugOffsets: %w", c.m.Path, err)
			return fi
		}
		fi.lay, fi.err = parseDebugOffsets(b, fi.minor)
	} else {
		fi.lay, fi.err = staticLayout(fi.minor)
	}
	if fi.err == nil {
		fi.err = fi.lay.check()
	}
	if fi.err != nil {
		fi.err = fmt.Errorf("%s: %w", c.m.Path, fi.err)
	}
	return fi
}

// bias is what turns the file's addresses into the process's for mapping m.
func bias(m *normalize.Mapping) (uint64, bool) {
	if m.File == nil {
		return 0, false
	}
	v, ok := addrmap.FileOffsetToVaddr(m.File.Loads, m.Offset)
	if !ok {
		return 0, false
	}
	return m.Start - v, true
}

// interpHead finds 3.6's interp_head: its symbol where the file has
// .symtab, else the RIP-relative load that PyInterpreterState_Head (the
// function that returns it) starts with, "mov disp32(%rip),%rax; ret".
func interpHead(f *elfx.File, syms map[string]elf.Symbol) (uint64, error) {
	if s, ok := syms[symInterpHead]; ok && s.Size == 8 {
		return s.Value, nil
	}
	fn, ok := syms[symInterpHeadFunc]
	if !ok {
		return 0, fmt.Errorf("no %s nor %s: %w", symInterpHead, symInterpHeadFunc, errUnsupported)
	}
	b, err := f.ReadVaddr(fn.Value, 8)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", symInterpHeadFunc, err)
	}
	if b[0] != 0x48 || b[1] != 0x8b || b[2] != 0x05 || b[7] != 0xc3 {
		return 0, fmt.Errorf("%s does not start with a load of interp_head (% x): %w", symInterpHeadFunc, b, errLayout)
	}
	return uint64(int64(fn.Value) + 7 + int64(int32(binary.LittleEndian.Uint32(b[3:])))), nil
}
