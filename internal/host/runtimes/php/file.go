package php

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// Why a PHP cannot be walked.
var (
	errUnsupported = errors.New("unsupported PHP build")
	errLayout      = errors.New("PHP layout check failed")
	errNotReady    = errors.New("PHP not running a script yet")
)

// nameRE matches the files the Zend engine lives in: the CLI, CGI and FPM
// executables (php, php8.2, php-fpm8.2, php-cgi) or the embed/Apache
// library (libphp8.2.so, libphp.so).
var nameRE = regexp.MustCompile(`^(?:php(?:-fpm|-cgi)?[0-9.]*|(lib)php[0-9.]*\.so(?:\.[0-9.]+)?)$`)

// candidate is a mapping that may hold the Zend engine.
type candidate struct {
	m   *normalize.Mapping
	lib bool
}

// findCandidate picks the mapping of p whose file is a PHP engine by its
// name: the library when there is one (an Apache worker maps libphp).
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
		c := candidate{m: m, lib: sm[1] != ""}
		if !found || c.lib && !best.lib {
			best, found = c, true
		}
	}
	return best, found
}

// Symbols the engine exports in .dynsym (Debian strips .symtab).
const (
	symEG        = "executor_globals"        // NTS: the globals themselves
	symEGOffset  = "executor_globals_offset" // ZTS: their offset in each thread's block
	symExecuteEx = "execute_ex"              // the VM loop
)

// versionNeedle precedes the version in every build (the header PHP sends
// with expose_php).
var versionNeedle = []byte("X-Powered-By: PHP/")

// maxRodata bounds the read-only data searched for the version.
const maxRodata = 32 << 20

// fileInfo is what one PHP build says about itself, read from its ELF file
// once per file version. Addresses are the file's own (ELF virtual
// addresses).
type fileInfo struct {
	version    string // "8.2.29"
	major      int
	minor      int
	eg         uint64    // &executor_globals
	executeEx  [2]uint64 // [lo, hi)
	cold       [2]uint64 // execute_ex's split-off part; zero when none is found
	coldErr    error     // why none was
	lay        layout
	err        error // why its frames cannot be walked (its VM loop may still be known)
	notPHPFile bool  // no execute_ex: a launcher, not the engine
}

// openTimeout bounds opening an engine file.
const openTimeout = 10 * time.Second

// readFile inspects the engine file of c, opened through the process's own
// view of the file system. An error is a failure to open it there, which
// says nothing of the file.
func readFile(procDir string, c candidate) (*fileInfo, error) {
	err := errors.New("no path to open it by")
	for _, pth := range normalize.OpenPaths(procDir, c.m.Start, c.m.End, c.m.Path) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		f, oerr := elfx.OpenContext(ctx, pth, elfx.Limits{})
		cancel()
		if oerr == nil {
			defer func() { _ = f.Close() }()
			return inspect(f, c.m.Path), nil
		}
		err = oerr
	}
	return nil, fmt.Errorf("opening %s: %w", c.m.Path, err)
}

// inspect reads an engine's symbols, version and layout.
func inspect(f *elfx.File, name string) *fileInfo {
	fi := &fileInfo{}
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		fi.err = fmt.Errorf("%s on %s: %w", name, f.Machine, errUnsupported)
		return fi
	}
	syms := map[string]elf.Symbol{}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		ss, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			fi.err = fmt.Errorf("%s symbols: %w", name, err)
			return fi
		}
		for _, s := range ss {
			switch s.Name {
			case symEG, symEGOffset, symExecuteEx:
				if _, dup := syms[s.Name]; !dup && s.Value != 0 {
					syms[s.Name] = s
				}
			}
		}
	}
	ex, ok := syms[symExecuteEx]
	if !ok || ex.Size == 0 {
		fi.notPHPFile = true
		fi.err = fmt.Errorf("%s: no %s: %w", name, symExecuteEx, errUnsupported)
		return fi
	}
	fi.executeEx = [2]uint64{ex.Value, ex.Value + ex.Size}
	if s, e, err := coldPart(f, ex.Value, ex.Value+ex.Size); err == nil {
		fi.cold = [2]uint64{s, e}
	} else {
		fi.coldErr = err
	}
	if err := fi.readVersion(f); err != nil {
		fi.err = fmt.Errorf("%s: %w", name, err)
		return fi
	}
	if _, zts := syms[symEGOffset]; zts {
		fi.err = fmt.Errorf("%s: PHP %s is a thread-safe (ZTS) build: %w", name, fi.version, errUnsupported)
		return fi
	}
	eg, ok := syms[symEG]
	if !ok {
		fi.err = fmt.Errorf("%s: PHP %s exports no %s: %w", name, fi.version, symEG, errUnsupported)
		return fi
	}
	fi.eg = eg.Value
	lay, err := layoutFor(fi.major, fi.minor)
	if err != nil {
		fi.err = fmt.Errorf("%s: PHP %s: %w", name, fi.version, err)
		return fi
	}
	if eg.Size != 0 && uint64(lay.egCurrentEx)+8 > eg.Size {
		fi.err = fmt.Errorf("%s: executor_globals of %d bytes: %w", name, eg.Size, errLayout)
		return fi
	}
	fi.lay = lay
	return fi
}

// versionRE is the version after versionNeedle.
var versionRE = regexp.MustCompile(`^([0-9]+)\.([0-9]+)\.[0-9]+`)

func (fi *fileInfo) readVersion(f *elfx.File) error {
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&(elf.SHF_WRITE|elf.SHF_EXECINSTR) != 0 ||
			sec.Size > maxRodata {
			continue
		}
		b, err := f.SectionData(sec.Name)
		if err != nil {
			continue
		}
		i := bytes.Index(b, versionNeedle)
		if i < 0 {
			continue
		}
		rest := b[i+len(versionNeedle):]
		if j := bytes.IndexByte(rest, 0); j >= 0 {
			rest = rest[:j]
		}
		sm := versionRE.FindSubmatch(rest)
		if sm == nil {
			return fmt.Errorf("version string %.40q: %w", rest, errUnsupported)
		}
		fi.version = string(sm[0])
		fi.major, _ = strconv.Atoi(string(sm[1]))
		fi.minor, _ = strconv.Atoi(string(sm[2]))
		return nil
	}
	return fmt.Errorf("no PHP version string: %w", errUnsupported)
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
