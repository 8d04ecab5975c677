package symbolize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/filever"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize/symindex"
	"github.com/profsym/profsym/internal/symbolize/symtab"
)

// ErrIndexOptions: an index compiled with other options (inlined frames,
// symbol table names) than the resolver's, whose answers would differ.
var ErrIndexOptions = errors.New("symbol index compiled with other options")

// ErrNotIndexable: the object's answers cannot be compiled whole (no DWARF,
// a part of it missing or over a limit, no build id); it is used as it is.
var ErrNotIndexable = errors.New("object not indexable")

func (o *Options) indexFlags() uint32 {
	var f uint32
	if o.Inlines {
		f |= symindex.FlagInlines
	}
	if o.UseSymbolTable {
		f |= symindex.FlagSymbolTable
	}
	return f
}

// IndexStats describes a compiled index.
type IndexStats struct {
	Bounds int   // addresses asked
	Ranges int   // ranges written
	Bytes  int64 // size of the index
}

// WriteIndex compiles the handle's object into a symbol index (see package
// symindex) written to w: every address's answer, as Lookup gives it with
// the resolver's options, from the DWARF, pclntab and symbol tables the
// object has. It asks the object once per address where an answer may
// change (the sources' Bounds), so the index answers every address as the
// object does. An object whose answers are not whole (no DWARF, a dwz file
// or split unit missing, a unit that does not parse or is over a limit)
// fails with an error wrapping ErrNotIndexable: an index would keep the
// gap for every replica, for good.
func (h *Handle) WriteIndex(ctx context.Context, w io.Writer) (IndexStats, error) {
	o, opt := h.obj, &h.r.opt
	var st IndexStats
	switch {
	case o.idx != nil:
		return st, fmt.Errorf("%w: already an index", ErrNotIndexable)
	case o.dwarf == nil:
		return st, fmt.Errorf("%w: no DWARF (%w)", ErrNotIndexable, o.why)
	case o.supErr != nil:
		return st, fmt.Errorf("%w: %w", ErrNotIndexable, o.supErr)
	}
	id := o.buildID
	if len(id) == 0 && o.dbg != nil {
		id, _ = buildid.GNU(o.dbg)
	}
	meta := symindex.Meta{BuildID: id, Flags: opt.indexFlags(), ImageBase: h.ImageBase()}
	if v, ok := h.SymbolValue("_stext"); ok {
		meta.Stext, meta.Flags = v, meta.Flags|symindex.FlagStext
	}
	iw, err := symindex.NewWriter(meta)
	if err != nil {
		return st, fmt.Errorf("%w: %w", ErrNotIndexable, err)
	}
	var bounds []uint64
	add := func(a uint64) { bounds = append(bounds, a) }
	// The parsed units are the object's, charged to the cache: a build
	// that would need more than the cache holds is not done.
	if err := o.dwarf.Bounds(ctx, opt.CacheBytes/2, add); err != nil {
		return st, fmt.Errorf("%w: %w", ErrNotIndexable, err)
	}
	if o.gopcln != nil {
		if err := o.gopcln.Bounds(add); err != nil {
			return st, fmt.Errorf("%w: %w", ErrNotIndexable, err)
		}
	}
	if opt.UseSymbolTable {
		for _, t := range [...]*symtab.Table{o.syms, o.dbgSyms} {
			if t != nil {
				t.Bounds(add)
			}
		}
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	st.Bounds = len(bounds)
	if len(bounds) == 0 {
		return st, fmt.Errorf("%w: nothing to index", ErrNotIndexable)
	}
	var frames []frame.Frame
	last := len(bounds) - 1
	for i, a := range bounds {
		if i&4095 == 0 && ctx.Err() != nil {
			return st, ctx.Err()
		}
		var missing, err error
		frames, missing, err = o.lookup(a, opt, frames[:0])
		switch {
		case missing != nil:
			return st, fmt.Errorf("%w: %#x: %w", ErrNotIndexable, a, missing)
		case err != nil && !errors.Is(err, frame.ErrNoDebugInfo):
			return st, fmt.Errorf("%w: %#x: %w", ErrNotIndexable, a, err)
		case i == last:
			// Every source's ranges end at or before the last bound.
			if len(frames) > 0 {
				return st, fmt.Errorf("%w: answer at the last bound %#x", ErrNotIndexable, a)
			}
			if st.Bytes, err = iw.Finish(a, w); err != nil {
				return st, err
			}
		default:
			if err := iw.Add(a, frames); err != nil {
				return st, fmt.Errorf("%w: %w", ErrNotIndexable, err)
			}
		}
	}
	st.Ranges = iw.Ranges()
	return st, nil
}

// OpenIndex returns a handle answering from the symbol index at path, which
// must have been compiled for buildID with the resolver's options. It is
// cached like an object opened from files. An index that is malformed,
// forged, of another build or format version, or compiled with other
// options fails (frame.ErrCorruptFile, frame.ErrBuildIDMismatch,
// symindex.ErrVersion, ErrIndexOptions): the caller opens the object's
// files instead.
func (r *Resolver) OpenIndex(ctx context.Context, path string, buildID []byte) (*Handle, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, classify(err))
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file: %w", path, frame.ErrInvalidPath)
	}
	key := "index|" + filever.Of(path, st).String()
	for {
		if e, ok := r.cache.Get(key); ok {
			if e.obj == nil {
				return nil, e.err // a bad index stays bad: it is rebuilt under another name or not at all
			}
			e.obj.acquire()
			if !e.obj.retired.Load() {
				if !bytes.Equal(e.obj.buildID, buildID) {
					e.obj.release()
					return nil, fmt.Errorf("%s: index of %x, asked for %x: %w", path, e.obj.buildID, buildID, frame.ErrBuildIDMismatch)
				}
				return &Handle{r: r, key: key, obj: e.obj}, nil
			}
			e.obj.release()
			continue
		}
		res, _, _ := r.group.Do(key, func() (any, error) {
			e := r.loadIndex(path)
			r.cache.Add(key, e)
			return e, nil
		})
		if e := res.(*entry); e.obj == nil {
			return nil, e.err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", frame.ErrTimeout, err)
		}
	}
}

func (r *Resolver) loadIndex(path string) *entry {
	x, err := symindex.Open(path, r.opt.MaxIndexBytes)
	if err != nil {
		if !errors.Is(err, symindex.ErrVersion) && frame.Reason(err) == "error" {
			err = classify(err)
		}
		return &entry{err: err, failedAt: time.Now()}
	}
	m := x.Meta()
	if m.Flags&^symindex.FlagStext != r.opt.indexFlags() {
		_ = x.Close()
		return &entry{err: fmt.Errorf("%s: flags %#x, resolver %#x: %w", path, m.Flags, r.opt.indexFlags(), ErrIndexOptions), failedAt: time.Now()}
	}
	o := &object{idx: x, buildID: m.BuildID, sups: r.sups}
	r.indexes.Add(1)
	return &entry{obj: o}
}

// indexHeapBytes is what an object opened from an index is charged in the
// object cache: its copied names, bounded by the index's name cache.
const indexHeapBytes = symindex.MaxNameCacheBytes
