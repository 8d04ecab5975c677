package otlpsym

import (
	"fmt"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize"
)

// objRef is one object of a batch: the identity of a mapping's file and
// where to look for it.
type objRef struct {
	q        locate.Query
	key      string
	num, gen uint64 // see Symbolizer.number
	h        *symbolize.Handle
	err      error   // why the object could not be opened
	complete bool    // its files have DWARF: answers never get better
	pending  bool    // a better file is still being fetched: answers may improve soon
	mappings []int32 // mappings of the batch with this identity (hints)
	fail     *result // set for frames that fail before any lookup

	// Translation bases, looked up once per batch rather than per frame
	// (finding _stext scans the symbol table).
	base, stext                uint64
	stextOK, baseSet, stextSet bool
}

// work is one raw location to resolve.
type work struct {
	loc  int32
	obj  *objRef
	addr uint64
	tr   translation // how addr becomes an ELF address once the object is open
}

// failed is the objRef of frames that fail before any lookup (no mapping,
// an invalid identity): its answer is fixed.
func failed(err error) *objRef { return &objRef{fail: &result{err: err}} }

// translation turns a location's address into the object's ELF address.
type translation struct {
	kind uint8
	from uint64 // kernelText: the run-time _stext
}

const (
	asIs       uint8 = iota // already an ELF virtual address
	imageBase               // an offset from the image base (remote frames): plus the p_vaddr mapping file offset 0
	kernelText              // a run-time kernel address: minus run-time _stext, plus vmlinux's
)

func (t translation) apply(o *objRef, addr uint64) (uint64, error) {
	switch t.kind {
	case imageBase:
		if !o.baseSet {
			o.base, o.baseSet = o.h.ImageBase(), true
		}
		return addr + o.base, nil
	case kernelText:
		if !o.stextSet {
			o.stext, o.stextOK = o.h.SymbolValue("_stext")
			o.stextSet = true
		}
		if !o.stextOK {
			return 0, fmt.Errorf("vmlinux has no _stext symbol: %w", frame.ErrNoDebugInfo)
		}
		return addr - t.from + o.stext, nil
	}
	return addr, nil
}

// batch is one call's view of its input.
type batch struct {
	s    *Symbolizer
	d    *pdict.Dict
	pd   pprofile.Profiles
	objs map[string]*objRef
}

type procHint struct {
	pid int64
	exe string
}

// object returns the batch's objRef for an identity, creating it.
func (b *batch) object(id frame.Identity, kernel bool) *objRef {
	q := locate.Query{ID: id, Kernel: kernel}
	key := id.Key()
	if kernel {
		key = "k" + key
	}
	if o, ok := b.objs[key]; ok {
		return o
	}
	o := &objRef{q: q, key: key}
	b.objs[key] = o
	return o
}

// mappingObject returns the work template of mapping mi: its object, or the
// reason it has none.
func (b *batch) mappingObject(mi int32) work {
	d := b.d
	m := d.D.MappingTable().At(int(mi))
	id, err := mappingIdentity(d, m)
	if err != nil {
		return work{obj: failed(err)}
	}
	if id.IsZero() {
		return work{obj: failed(fmt.Errorf("mapping %d (%.200s) has no build id or htlhash: %w", mi, d.Str(m.FilenameStrindex()), frame.ErrNoMapping))}
	}
	o := b.object(id, false)
	if len(o.mappings) < locate.MaxHints {
		o.mappings = append(o.mappings, mi)
	}
	return work{obj: o}
}

// mappingIdentity reads and validates a mapping's identity attributes.
func mappingIdentity(d *pdict.Dict, m pprofile.Mapping) (frame.Identity, error) {
	var gnu, goID, htl string
	for _, ai := range m.AttributeIndices().All() {
		k, v, ok := d.Attr(ai)
		if !ok {
			continue
		}
		switch k {
		case frame.AttrBuildIDGNU:
			gnu = v.AsString()
		case frame.AttrBuildIDGo:
			goID = v.AsString()
		case frame.AttrBuildIDHTL:
			htl = v.AsString()
		}
	}
	return frame.ParseIdentity(gnu, goID, htl)
}

// hints fills in, for the objects to locate, a process that mapped them
// (pid, executable) from the resources whose samples use their mappings:
// what the proc and local sources need for the upstream profiler's base
// name mappings. Walked once per batch, only when something is located.
// Logs bring their hints with each frame: there is no profile to walk.
func (b *batch) hints(need map[*objRef]bool) {
	if len(need) == 0 || b.d == nil {
		return
	}
	procs := map[int32]procHint{}
	release := ""
	d := b.d
	stacks, locs := d.D.StackTable(), d.D.LocationTable()
	for _, rp := range b.pd.ResourceProfiles().All() {
		a := rp.Resource().Attributes()
		var h procHint
		if v, ok := a.Get(frame.AttrPID); ok {
			h.pid = v.Int()
		}
		if v, ok := a.Get(frame.AttrExePath); ok {
			h.exe = v.AsString()
		}
		if v, ok := a.Get(frame.AttrKernelRelease); ok && release == "" {
			release = v.AsString()
		}
		if h.pid <= 0 && h.exe == "" {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, smp := range p.Samples().All() {
					si := smp.StackIndex()
					if si <= 0 || int(si) >= stacks.Len() {
						continue
					}
					for _, li := range stacks.At(int(si)).LocationIndices().All() {
						if li <= 0 || int(li) >= locs.Len() {
							continue
						}
						mi := locs.At(int(li)).MappingIndex()
						if _, ok := procs[mi]; !ok {
							procs[mi] = h
						}
					}
				}
			}
		}
	}
	maps := d.D.MappingTable()
	for o := range need {
		if o.q.Kernel {
			o.q.KernelRelease = release
			continue
		}
		for _, mi := range o.mappings {
			m := maps.At(int(mi))
			h := procs[mi]
			o.q.AddHint(locate.Hint{File: d.Str(m.FilenameStrindex()), FileOffset: m.FileOffset(), PID: h.pid, ExePath: h.exe})
		}
	}
}
