package profbuild

import (
	"cmp"
	"path/filepath"
	"strings"

	"github.com/profsym/profsym/internal/addrmap"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize/kernel"
)

// userFrame normalizes one user PC of po. Callers' PCs are return addresses
// and are stepped back into the call instruction first.
func (r *run) userFrame(po *procOut, pc uint64, caller bool) frame {
	addr := pc
	if caller {
		addr = addrmap.ReturnAddressAdjust(pc)
	}
	k := frameKey{pid: po.pid, pre: po.pre, addr: addr}
	if f, ok := r.frames[k]; ok {
		return f
	}
	f := r.normalizeUser(po, addr)
	r.frames[k] = f
	return f
}

func (r *run) normalizeUser(po *procOut, addr uint64) frame {
	if po.p == nil {
		r.fail(ReasonProcessGone)
		return r.rawFrame(0, addr, "", pframe.TypeNative)
	}
	m, vaddr, ok := po.p.Normalize(addr)
	if m == nil && r.refresh(po) {
		// A library loaded after the snapshot (dlopen).
		m, vaddr, ok = po.p.Normalize(addr)
	}
	switch {
	case m == nil:
		r.fail(ReasonNoMapping)
		return r.rawFrame(0, addr, "", pframe.TypeNative)
	case m.Anonymous:
		return r.jitFrame(po, m, addr)
	case m.File == nil && m.Path == "[vdso]":
		return r.vdsoFrame(po, m, addr)
	case m.File == nil:
		// [vsyscall]: the image's own addresses start at 0.
		return r.rawFrame(r.mapping(m), addr-m.Start+m.Offset, m.Path, pframe.TypeNative)
	case !ok:
		if m.File.Err != nil || len(m.File.Loads) == 0 {
			r.fail(ReasonUnreadableFile)
		} else {
			r.fail(ReasonNoLoadSegment)
		}
		f := r.rawFrame(r.mapping(m), addr-m.Start+m.Offset, m.Path, pframe.TypeNative)
		f.setIDs(m.File)
		return f
	}
	f := r.rawFrame(r.mapping(m), vaddr, m.Path, pframe.TypeNative)
	f.setIDs(m.File)
	return f
}

// refresh re-reads po's mappings at most once per report.
func (r *run) refresh(po *procOut) bool {
	if po.pre || r.refreshed[po.pid] {
		return false // an image replaced by exec is not there to reread
	}
	r.refreshed[po.pid] = true
	if r.b.syncExec(po.pid) {
		// It exec'd after this drain's samples were taken, all of them
		// of the image po holds: reading the new one would misname them.
		return false
	}
	p, err := r.b.norm.Refresh(po.pid)
	if err != nil {
		return false
	}
	po.p = p
	return true
}

func (f *frame) setIDs(fi *normalize.FileInfo) {
	f.gnu, f.goID, f.htl = fi.GNUBuildID, fi.GoBuildID, fi.HTLHash
}

func (r *run) rawFrame(mapping int32, addr uint64, file, typ string) frame {
	loc := r.dict.Location(pdict.Location{
		Mapping: mapping, Address: addr,
		Attrs: []int32{r.dict.AttrStr(pframe.AttrFrameType, typ)},
	})
	return frame{loc: loc, addr: addr, file: file, typ: typ}
}

func (r *run) namedFrame(mapping int32, addr uint64, file, typ, fn string) frame {
	fi := r.dict.Function(fn, fn, "", 0)
	loc := r.dict.Location(pdict.Location{
		Mapping: mapping, Address: addr,
		Attrs: []int32{r.dict.AttrStr(pframe.AttrFrameType, typ)},
		Lines: []pdict.Line{{Function: fi}},
	})
	return frame{loc: loc, addr: addr, file: file, typ: typ, fn: fn}
}

// mapping returns the dictionary index of a process mapping, with the
// file's identities as attributes.
func (r *run) mapping(m *normalize.Mapping) int32 {
	if i, ok := r.mappings[m]; ok {
		return i
	}
	var attrs []int32
	file := m.Path
	if m.Anonymous {
		file = pframe.FileJIT
	}
	if fi := m.File; fi != nil {
		if fi.GNUBuildID != "" {
			attrs = append(attrs, r.dict.AttrStr(pframe.AttrBuildIDGNU, fi.GNUBuildID))
		}
		if fi.GoBuildID != "" {
			attrs = append(attrs, r.dict.AttrStr(pframe.AttrBuildIDGo, fi.GoBuildID))
		}
		if fi.HTLHash != "" {
			attrs = append(attrs, r.dict.AttrStr(pframe.AttrBuildIDHTL, fi.HTLHash))
		}
	}
	i := r.dict.Mapping(pdict.Mapping{Start: m.Start, Limit: m.End, Offset: m.Offset, File: file, Attrs: attrs})
	r.mappings[m] = i
	return i
}

// jitFrame handles anonymous executable memory: named from the process's
// perf map when enabled, raw otherwise. The address stays the process's.
func (r *run) jitFrame(po *procOut, m *normalize.Mapping, addr uint64) frame {
	mi := r.mapping(m)
	if r.b.jit != nil && !po.jitRead {
		// One check of the file per process and report, not per frame.
		po.jitRead = true
		po.jit, _ = r.b.jit.Map(po.pid)
	}
	if po.jit != nil {
		if name, _, ok := po.jit.Lookup(addr); ok {
			return r.namedFrame(mi, addr, pframe.FileJIT, jitType(po), name)
		}
	}
	r.fail(ReasonJITUnnamed)
	return r.rawFrame(mi, addr, pframe.FileJIT, pframe.TypeNative)
}

// jitType tells the runtime from the executable's name.
func jitType(po *procOut) string {
	name := po.comm
	if po.p != nil && po.p.ExePath != "" {
		name = filepath.Base(po.p.ExePath)
	}
	switch {
	case name == "java" || strings.HasPrefix(name, "java"):
		return pframe.TypeJVM
	case name == "node" || name == "nodejs" || name == "deno" || strings.HasPrefix(name, "node"):
		return pframe.TypeV8JS
	case name == "dotnet" || strings.HasPrefix(name, "dotnet"):
		return pframe.TypeDotnet
	}
	return pframe.TypeNative
}

// runtimeFrame names a frame of a language runtime (a Java method, a
// Python function) from the process's memory, through the runtime that
// walked it. It has no mapping: nothing later could name it from a file.
func (r *run) runtimeFrame(po *procOut, rf runtimes.Frame) frame {
	k := frameKey{pid: po.pid, pre: po.pre, addr: rf.Ptr, aux: rf.Aux, rtKind: rf.Kind}
	if f, ok := r.frames[k]; ok {
		return f
	}
	var sym runtimes.Symbol
	err := runtimes.ErrNotAttached
	if r.b.opt.Runtimes != nil {
		sym, err = r.b.opt.Runtimes.Name(po.pid, rf)
	}
	typ := runtimes.FrameType(rf.Kind)
	var f frame
	if err != nil || len(sym.Frames) == 0 {
		r.fail(ReasonRuntimeUnnamed)
		loc := r.dict.Location(pdict.Location{Address: rf.Ptr, Attrs: []int32{
			r.dict.AttrStr(pframe.AttrFrameType, typ),
			r.dict.AttrStr(pframe.AttrError, runtimes.Reason(err)),
		}})
		f = frame{loc: loc, addr: rf.Ptr, typ: typ}
	} else {
		if sym.Type != "" {
			typ = sym.Type
		}
		lines := make([]pdict.Line, len(sym.Frames))
		for i, sf := range sym.Frames {
			file := cmp.Or(sf.File, sf.StartFile)
			lines[i] = pdict.Line{Function: r.dict.Function(sf.Name, sf.Name, file, int64(sf.StartLine)), Line: int64(sf.Line)}
		}
		loc := r.dict.Location(pdict.Location{Attrs: []int32{r.dict.AttrStr(pframe.AttrFrameType, typ)}, Lines: lines})
		outer := sym.Frames[len(sym.Frames)-1]
		f = frame{loc: loc, file: outer.File, typ: typ, fn: outer.Name}
	}
	r.frames[k] = f
	return f
}

// kernelFrame builds a kernel frame: its address is the kernel's own,
// its mapping vmlinux or the module holding it.
func (r *run) kernelFrame(pc uint64, caller bool) frame {
	addr := pc
	if caller {
		addr = addrmap.ReturnAddressAdjust(pc)
	}
	k := frameKey{addr: addr, kernel: true}
	if f, ok := r.frames[k]; ok {
		return f
	}
	name, module, _, ok := r.b.kern.Lookup(addr)
	mi, file := r.kernelMapping(module)
	var f frame
	switch {
	case !ok:
		r.fail(ReasonKernelUnnamed)
		f = r.rawFrame(mi, addr, file, pframe.TypeKernel)
	case r.b.opt.KernelSymbols:
		f = r.namedFrame(mi, addr, file, pframe.TypeKernel, name)
	default:
		f = r.rawFrame(mi, addr, file, pframe.TypeKernel)
	}
	f.gnu = r.kinfo.BuildID
	if module != "" {
		f.gnu = r.kinfo.Modules[module]
	}
	r.frames[k] = f
	return f
}

func (r *run) kernelMapping(module string) (int32, string) {
	if !r.kinfoRead {
		r.kinfoRead = true
		r.kinfo, _ = r.b.kern.Info()
	}
	file, id := pframe.FileKernel, r.kinfo.BuildID
	if module != "" {
		file, id = "["+module+"]", r.kinfo.Modules[module]
	}
	if i, ok := r.kernMaps[module]; ok {
		return i, file
	}
	var attrs []int32
	if id != "" {
		attrs = append(attrs, r.dict.AttrStr(pframe.AttrBuildIDGNU, id))
	}
	m := pdict.Mapping{File: file, Attrs: attrs}
	if module == "" {
		// The run-time [_stext, _etext): with vmlinux's own _stext it undoes
		// KASLR, so a symbolizer elsewhere can name raw kernel frames.
		if tp, ok := r.b.kern.(interface {
			Table() (*kernel.Table, error)
		}); ok {
			if t, err := tp.Table(); err == nil {
				m.Start, m.Limit = t.CoreText()
			}
		}
	}
	i := r.dict.Mapping(m)
	r.kernMaps[module] = i
	return i, file
}
