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
	fi := s.funcIndexFor()
	defer s.putFuncIndex(fi)
	s.mu.Lock()
	known := s.nextFunc // functions numbered before now: a slice marks them
	s.mu.Unlock()
	// What the batch's dictionary needs, a share of the answers per core:
	// the functions of its answers in the order they first appear in it,
	// the locations that get a reason, and the mappings' flags.
	n := shares(len(todo))
	fns, marked := make([][]*function, n), make([][]int32, n)
	flags := make([][]mappingFlags, n)
	parallel(len(todo), n, func(k, lo, hi int) {
		// By number from fi.base where the table is not much larger than
		// the share (a small batch of a large table would clear more
		// than it reads), else in other.
		var seen []bool
		if known > fi.base && known-fi.base <= min(uint64(8*(hi-lo)), maxFuncSlots) {
			seen = make([]bool, known-fi.base)
		}
		var other map[*function]bool // the rest
		var list []*function
		var mark []int32
		touched := make([]mappingFlags, maps.Len()) // by mapping index
		for i := lo; i < hi; i++ {
			r := answers[i]
			if r.err != nil {
				mark = append(mark, int32(i))
				continue
			}
			for _, l := range r.lines {
				f := l.fn
				if f.id >= fi.base && f.id-fi.base < uint64(len(seen)) {
					if seen[f.id-fi.base] {
						continue
					}
					seen[f.id-fi.base] = true
				} else {
					if other[f] {
						continue
					}
					if other == nil {
						other = map[*function]bool{}
					}
					other[f] = true
				}
				list = append(list, f)
			}
			if r.missing != "" {
				mark = append(mark, int32(i))
			}
			if mi := locs.At(int(todo[i].loc)).MappingIndex(); mi > 0 && int(mi) < len(touched) {
				touched[mi].add(r.lines)
			}
		}
		fns[k], marked[k], flags[k] = list, mark, touched
	})
	// Then, on this goroutine, the dictionary's writes, shares in order:
	// the functions in the order of their first use in the batch, the
	// reasons, the mappings' flags.
	addFn := func(f *function) int32 { return d.Function(f.name, f.system, f.file, f.startLine) }
	for _, list := range fns {
		for _, f := range list {
			fi.get(f, addFn)
		}
	}
	for _, mark := range marked {
		for _, i := range mark {
			r, loc := answers[i], locs.At(int(todo[i].loc))
			switch {
			case r.err != nil:
				// A remote frame keeps its "<remote>" line: that is its
				// only record of build id and offset.
				if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrError); !has {
					loc.AttributeIndices().Append(d.AttrStr(frame.AttrError, frame.Reason(r.err)))
				}
			case r.missing != "":
				if _, has := d.FindAttr(loc.AttributeIndices(), frame.AttrIncomplete); !has {
					loc.AttributeIndices().Append(d.AttrStr(frame.AttrIncomplete, r.missing))
				}
			}
		}
	}
	touched := flags[0]
	for _, f := range flags[1:] {
		for mi := range f {
			touched[mi].or(f[mi])
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
	parallel(len(todo), n, func(_, lo, hi int) {
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

// shares is how many shares parallel cuts n items into: at least minShare
// items each, at most one per CPU.
func shares(n int) int { return max(1, min(runtime.GOMAXPROCS(0), n/minShare)) }

// parallel runs fn over [0, n) in the given number of shares (from
// shares(n), taken once by the caller, who sizes per-share results by it:
// GOMAXPROCS may change meanwhile), share k on [lo, hi), one goroutine per
// share.
func parallel(n, workers int, fn func(k, lo, hi int)) {
	if workers <= 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for k := range workers {
		lo, hi := n*k/workers, n*(k+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(k, lo, hi)
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

func (f *mappingFlags) or(o mappingFlags) {
	f.funcs = f.funcs || o.funcs
	f.files = f.files || o.files
	f.lines = f.lines || o.lines
	f.inlines = f.inlines || o.inlines
	f.seen = f.seen || o.seen
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
