package otlpsym

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// Profiles symbolizes every raw native location of pd in place.
func (s *Symbolizer) Profiles(ctx context.Context, pd pprofile.Profiles) Stats {
	var st Stats
	d := pdict.New(pd.Dictionary())
	locs := d.D.LocationTable()
	maps := d.D.MappingTable()
	b := &batch{s: s, d: d, pd: pd, objs: map[string]*objRef{}}

	mapWork := make([]work, maps.Len()) // by mapping index: the object, or why there is none
	mapSeen := make([]bool, maps.Len())
	addrBase := d.StringIndex(frame.AttrAddressBase)
	todo := make([]work, 0, locs.Len())
	var noMapping *objRef
	frameType := d.StringIndex(frame.AttrFrameType)
	for i := 1; i < locs.Len(); i++ {
		loc := locs.At(i)
		if loc.Lines().Len() > 0 {
			if w, ok := s.remoteFrame(b, int32(i)); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		if v, ok := d.FindAttrKey(loc.AttributeIndices(), frameType); ok && v.Str() != frame.TypeNative && v.Str() != "" {
			if w, ok := s.kernelFrame(b, v.Str(), int32(i)); ok {
				todo = append(todo, w)
				continue
			}
			st.Skipped++
			continue
		}
		mi := loc.MappingIndex()
		if mi <= 0 || int(mi) >= len(mapWork) {
			if noMapping == nil {
				noMapping = failed(fmt.Errorf("native frame without a mapping: %w", frame.ErrNoMapping))
			}
			todo = append(todo, work{loc: int32(i), obj: noMapping})
			continue
		}
		if !mapSeen[mi] {
			mapWork[mi] = b.mappingObject(mi)
			mapSeen[mi] = true
			if addrBase > 0 {
				if v, ok := d.FindAttrKey(maps.At(int(mi)).AttributeIndices(), addrBase); ok && v.Str() == frame.AddressBaseImage {
					mapWork[mi].tr = translation{kind: imageBase} // image-base offsets (docs/jfr.md)
				}
			}
		}
		w := mapWork[mi]
		w.loc, w.addr = int32(i), loc.Address()
		todo = append(todo, w)
	}
	if len(todo) == 0 {
		return st
	}

	answers := s.resolve(ctx, b, todo, &st)
	touched := make([]mappingFlags, maps.Len()) // by mapping index
	fi := s.funcIndexFor()
	defer s.putFuncIndex(fi)
	addFn := func(f *function) int32 { return d.Function(f.name, f.system, f.file, f.startLine) }
	// First, one pass for all that writes the batch's dictionary (the
	// answers' functions, the reasons) and the mappings' flags.
	for i, w := range todo {
		r := answers[i]
		loc := locs.At(int(w.loc))
		if r.err != nil {
			reason := frame.Reason(r.err)
			// A remote frame keeps its "<remote>" line: that is its only
			// record of build id and offset.
			if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrError); !has {
				loc.AttributeIndices().Append(d.AttrStr(frame.AttrError, reason))
			}
			continue
		}
		for _, l := range r.lines {
			fi.get(l.fn, addFn)
		}
		if r.missing != "" {
			if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrIncomplete); !has {
				loc.AttributeIndices().Append(d.AttrStr(frame.AttrIncomplete, r.missing))
			}
		}
		if mi := loc.MappingIndex(); mi > 0 && int(mi) < len(touched) {
			touched[mi].add(r.lines)
		}
	}
	for mi := range touched {
		if f := &touched[mi]; f.seen {
			f.apply(d, maps.At(mi))
		}
	}
	// Then the lines, each location's own (allocating them is most of a
	// warm batch's work), a share of the locations per core: they touch
	// nothing shared but the function indexes, now read only.
	parallel(len(todo), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if r := answers[i]; r.err == nil {
				setLines(locs.At(int(todo[i].loc)), r.lines, fi)
			}
		}
	})
	return st
}

// minShare is the fewest items worth a goroutine of their own.
const minShare = 16 << 10

// parallel runs fn over [0, n) in shares of at least minShare items, one
// goroutine per share, at most one per CPU.
func parallel(n int, fn func(lo, hi int)) {
	workers := max(1, min(runtime.GOMAXPROCS(0), n/minShare))
	if workers == 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for k := range workers {
		lo, hi := n*k/workers, n*(k+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// setLines writes a result (innermost first) as the location's lines;
// every function of lines is in fi already.
func setLines(loc pprofile.Location, lines []rline, fi *funcIndex) {
	ls := loc.Lines()
	if ls.Len() > 0 { // a remote frame's placeholder line
		ls.RemoveIf(func(pprofile.Line) bool { return true })
	}
	if len(lines) > 1 {
		ls.EnsureCapacity(len(lines))
	}
	for _, l := range lines {
		pl := ls.AppendEmpty()
		pl.SetFunctionIndex(fi.get(l.fn, nil))
		pl.SetLine(int64(l.line))
		pl.SetColumn(int64(l.col))
	}
}

// mappingFlags accumulates what symbolization found for one mapping.
type mappingFlags struct {
	funcs, files, lines, inlines, seen bool
}

func (f *mappingFlags) add(lines []rline) {
	f.seen = true
	for _, l := range lines {
		f.funcs = f.funcs || l.fn.name != ""
		f.files = f.files || l.fn.file != ""
		f.lines = f.lines || l.line != 0
	}
	f.inlines = f.inlines || len(lines) > 1
}

func (f *mappingFlags) apply(d *pdict.Dict, m pprofile.Mapping) {
	set := func(key string, v bool) {
		if !v {
			return
		}
		if old, ok := d.FindAttr(m.AttributeIndices(), key); ok && old.Bool() {
			return
		}
		m.AttributeIndices().Append(d.AttrBool(key, true))
	}
	set(frame.AttrHasFunctions, f.funcs)
	set(frame.AttrHasFilenames, f.files)
	set(frame.AttrHasLineNumbers, f.lines)
	set(frame.AttrHasInlineFrames, f.inlines)
}

// kernelFrame queues a raw kernel frame when the kernel source is on and
// its mapping says which vmlinux (build id) and where its text ran
// (memory_start is the run-time _stext).
func (s *Symbolizer) kernelFrame(b *batch, ftype string, i int32) (work, bool) {
	if ftype != frame.TypeKernel || !s.kernel {
		return work{}, false
	}
	d := b.d
	loc := d.D.LocationTable().At(int(i))
	mi := loc.MappingIndex()
	if mi <= 0 || int(mi) >= d.D.MappingTable().Len() {
		return work{}, false
	}
	m := d.D.MappingTable().At(int(mi))
	v, ok := d.FindAttr(m.AttributeIndices(), frame.AttrBuildIDGNU)
	if !ok || m.MemoryStart() == 0 || d.Str(m.FilenameStrindex()) != frame.FileKernel {
		return work{}, false
	}
	w := work{loc: i, addr: loc.Address(), tr: translation{kind: kernelText, from: m.MemoryStart()}}
	id, err := frame.ParseIdentity(v.AsString(), "", "")
	if err != nil {
		w.obj = failed(err)
		return w, true
	}
	w.obj = b.object(id, true)
	return w, true
}
