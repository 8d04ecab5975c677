package symbolize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/dwarf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/gopclntab"
	"github.com/profsym/profsym/internal/symbolize/symindex"
	"github.com/profsym/profsym/internal/symbolize/symtab"
)

// object is one binary with every symbol source found for it. Sources are
// built when the object is opened; each parses lazily inside.
type object struct {
	bin *elfx.File // the binary itself (may be nil when only a debug file is known)
	dbg *elfx.File // separate debug file, nil when none

	buildID []byte

	dwarf   *dwarf.Table
	sup     *supFile // the dwz common file its DWARF points into, or nil
	supErr  error    // why that file is missing, if it is
	split   *splitFiles
	gopcln  *gopclntab.Table
	syms    *symtab.Table // the binary's own (or the debug file's, when alone)
	dbgSyms *symtab.Table // the debug file's, a fallback
	// idx, when set, answers alone: the object was opened from its
	// symbol index, and none of the sources above is there.
	idx *symindex.Index

	// why explains the missing DWARF (no_debug_info, build_id_mismatch, ...).
	why error

	sups    *supCache
	refs    atomic.Int32
	retired atomic.Bool
	close   sync.Once
}

// openObject opens the binary at binPath and the debug file at debugPath
// (either may be empty) within lim and ctx, and attaches every source they
// hold. It searches for nothing: internal/locate chose the files.
func openObject(ctx context.Context, binPath, debugPath string, lim elfx.Limits,
	open func(context.Context, string, elfx.Limits) (*elfx.File, error),
	sups *supCache, findSplit func(context.Context, SplitRequest) (string, error)) (*object, error) {
	o := &object{sups: sups}
	var err error
	if binPath != "" {
		if o.bin, err = open(ctx, binPath, lim); err != nil {
			return nil, classify(err)
		}
		o.buildID, _ = buildid.GNU(o.bin)
	}
	if debugPath != "" {
		o.dbg, err = open(ctx, debugPath, lim)
		if err != nil {
			o.why = classify(err)
		} else if o.bin != nil && !sameBuildID(o.buildID, o.dbg) {
			o.dbg.Close()
			o.dbg = nil
			o.why = fmt.Errorf("%s: %w", debugPath, frame.ErrBuildIDMismatch)
		}
	}
	if o.bin == nil && o.dbg == nil {
		if o.why != nil {
			// The debug file was all there was: its reason (a timeout,
			// a limit, a corrupt file) is the answer, not "no file".
			return nil, o.why
		}
		return nil, fmt.Errorf("no file: %w", frame.ErrNotFound)
	}

	// The symbol tables and pclntab are built while the DWARF is indexed
	// (decompressing and indexing it is most of an open).
	var wg sync.WaitGroup
	if o.bin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if t, gerr := gopclntab.New(o.bin); gerr == nil {
				o.gopcln = t
			}
			// Like llvm-symbolizer, the outermost frame is named from the
			// binary's own table (a stripped binary: .dynsym only); the
			// debug file's complete .symtab is only a fallback for
			// addresses nothing else names, where llvm would answer "??".
			if t, serr := symtab.New(o.bin); serr == nil {
				o.syms = t
			}
		}()
	}
	var dbgSyms *symtab.Table
	if o.dbg != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if t, serr := symtab.New(o.dbg); serr == nil {
				dbgSyms = t
			}
		}()
	}
	// DWARF: from the debug file when there is one, else the binary.
	for _, f := range []*elfx.File{o.dbg, o.bin} {
		if f == nil || !f.HasSection(".debug_info") {
			continue
		}
		var x dwarf.Extra
		x.Sup, o.sup, o.supErr = sups.forFile(ctx, f, lim, open)
		if findSplit != nil || f.HasSection(".debug_cu_index") {
			o.split = &splitFiles{find: findSplit, files: []string{binPath, debugPath}, lim: lim, open: open, self: f}
			x.Split = o.split.unit
		}
		t, derr := dwarf.NewExtra(f, x)
		if derr == nil {
			o.dwarf = t
			o.why = nil
			break
		}
		sups.release(o.sup)
		o.sup, o.supErr = nil, nil
		// Whatever was inflated for the DWARF that failed is useless: give
		// it back now rather than keep it as long as the object is cached
		// (a bomb that inflates to just within the limit, then fails).
		f.DropDecoded()
		if o.why == nil || !errors.Is(derr, frame.ErrNoDebugInfo) {
			o.why = derr
		}
	}
	wg.Wait()
	if o.bin == nil {
		o.syms = dbgSyms
	} else {
		o.dbgSyms = dbgSyms
	}
	if o.why == nil && o.dwarf == nil {
		o.why = frame.ErrNoDebugInfo
	}
	return o, nil
}

// sameBuildID reports whether f carries the build id want. A binary without
// a build id cannot be checked this way (its debuglink CRC was checked by the
// finder instead); a debug file without one never matches a binary with one.
func sameBuildID(want []byte, f *elfx.File) bool {
	if len(want) == 0 {
		return true
	}
	got, _ := buildid.GNU(f)
	return bytes.Equal(got, want)
}

func classify(err error) error {
	if frame.Reason(err) != "error" { // already says why (limit_exceeded, invalid_path, timeout, ...)
		return err
	}
	var pe interface{ Timeout() bool }
	if errors.As(err, &pe) && pe.Timeout() {
		return fmt.Errorf("%w: %v", frame.ErrTimeout, err)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %v", frame.ErrNotFound, err)
	}
	return fmt.Errorf("%w: %v", frame.ErrCorruptFile, err)
}

// sizeBytes is the object's cost in the object cache.
func (o *object) sizeBytes() int64 {
	var n int64 = 4096
	if o.idx != nil {
		// Its pages are the file's, in the page cache, which the kernel
		// reclaims; what the heap holds is the names copied out.
		n += indexHeapBytes
	}
	if o.bin != nil {
		n += o.bin.SizeBytes()
	}
	if o.dbg != nil {
		n += o.dbg.SizeBytes()
	}
	if o.dwarf != nil {
		n += o.dwarf.SizeBytes()
	}
	if o.sup != nil {
		n += o.sup.sizeBytes()
	}
	if o.gopcln != nil {
		n += o.gopcln.SizeBytes()
	}
	for _, t := range []*symtab.Table{o.syms, o.dbgSyms} {
		if t != nil {
			n += t.SizeBytes()
		}
	}
	return n
}

// heldBytes is the decompressed section bytes the object's files hold.
func (o *object) heldBytes() int64 {
	var n int64
	for _, f := range []*elfx.File{o.bin, o.dbg} {
		if f != nil {
			n += f.HeldBytes()
		}
	}
	if o.sup != nil {
		n += o.sup.f.HeldBytes()
	}
	return n + o.split.heldBytes()
}

// acquire pins the object against closing while a lookup uses it.
func (o *object) acquire() { o.refs.Add(1) }

// release undoes acquire, closing a retired object when its last user leaves.
func (o *object) release() {
	if o.refs.Add(-1) == 0 && o.retired.Load() {
		o.closeFiles()
	}
}

// retire is called when the cache drops the object.
func (o *object) retire() {
	o.retired.Store(true)
	if o.refs.Load() == 0 {
		o.closeFiles()
	}
}

func (o *object) closeFiles() {
	o.close.Do(func() {
		if o.bin != nil {
			o.bin.Close()
		}
		if o.dbg != nil {
			o.dbg.Close()
		}
		o.sups.release(o.sup)
		o.split.close()
		if o.idx != nil {
			_ = o.idx.Close()
		}
	})
}

// lookup resolves one ELF virtual address. Frames come innermost first.
// Following llvm-symbolizer, the outermost frame takes its name and start
// address from the symbol table when a symbol covers the address: the table
// names the real (possibly cloned, e.g. ".constprop.0") function that the
// address belongs to, where DWARF names only the source function.
//
// missing is set when the frames come from a symbol table alone because
// debug info the object has could not be used (see Handle.Missing).
func (o *object) lookup(pc uint64, opt *Options, dst []frame.Frame) (_ []frame.Frame, missing, err error) {
	base := len(dst)
	if o.idx != nil {
		if dst, err = o.idx.Lookup(pc, dst); err == nil && len(dst) == base {
			err = frame.ErrNoDebugInfo
		}
		return dst, nil, err
	}
	var partial error // why the DWARF answer lacks what it points to elsewhere
	if o.dwarf != nil {
		dst, partial, err = o.dwarf.Lookup(pc, opt.Inlines, dst)
		if err != nil {
			dst = dst[:base]
		}
	}
	if len(dst) == base && o.gopcln != nil {
		var gerr error
		dst, gerr = o.gopcln.Lookup(pc, opt.Inlines, dst)
		if gerr != nil {
			dst = dst[:base]
			if err == nil {
				err = gerr
			}
		}
		for i := base; i < len(dst); i++ {
			dst[i].Name = goSymbolName(dst[i].Name)
		}
	}
	switch {
	case len(dst) == base:
	case partial != nil:
		// A skeleton unit answered without its split unit (.dwo, .dwp).
		missing = partial
	case o.supErr != nil:
		// DWARF answered without the dwz common file its names may live in.
		missing = o.supErr
	}
	if len(dst) == base {
		// Lines can come from nowhere else: say why, if the reason is a
		// failure rather than the plain absence of debug info.
		for _, e := range []error{err, o.why} {
			if e != nil && !errors.Is(e, frame.ErrNoDebugInfo) {
				missing = e
				break
			}
		}
	}
	if opt.UseSymbolTable {
		t := o.syms
		if len(dst) == base && o.dbgSyms != nil {
			if _, _, _, ok := o.dbgSyms.Lookup(pc); ok {
				t = o.dbgSyms
			}
		}
		if name, start, ok := symbolIn(t, pc); ok {
			if len(dst) == base {
				dst = append(dst, frame.Frame{Name: name, StartAddress: start})
			} else {
				outer := &dst[len(dst)-1]
				outer.Name = name
				outer.StartAddress = start
			}
			if outer := &dst[len(dst)-1]; outer.File == "" {
				outer.File = t.FileAt(pc)
			}
		}
	}
	if len(dst) > base {
		return dst, missing, nil
	}
	if err != nil {
		return dst, nil, err
	}
	if o.why != nil {
		return dst, nil, o.why
	}
	return dst, nil, frame.ErrNoDebugInfo
}

func symbolIn(t *symtab.Table, pc uint64) (string, uint64, bool) {
	if t == nil {
		return "", 0, false
	}
	name, start, _, ok := t.Lookup(pc)
	return name, start, ok
}

// goSymbolName spells a pclntab function name as the Go linker writes the
// same function's name in DWARF and the ELF symbol table: the middle dot
// the compiler puts in generated names ("type:.eq.T·7") becomes a dot, so
// a function has one name whether a binary is stripped or not (Go source
// identifiers cannot hold U+00B7: every one is the toolchain's).
func goSymbolName(s string) string {
	if !strings.Contains(s, "\u00b7") {
		return s
	}
	return strings.ReplaceAll(s, "\u00b7", ".")
}

// buildIDOfDebug is the debug file's GNU build id, for an object known by
// its debug file alone.
func (o *object) buildIDOfDebug() []byte {
	if o.dbg == nil {
		return nil
	}
	id, _ := buildid.GNU(o.dbg)
	return id
}
