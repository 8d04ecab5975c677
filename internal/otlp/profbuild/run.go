package profbuild

import (
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize/kernel"
	"github.com/profsym/profsym/internal/symbolize/perfmap"
)

// run builds one report.
type run struct {
	b          *Builder
	start, end time.Time
	prof       pprofile.Profiles
	dict       *pdict.Dict
	procs      map[int]*procOut
	order      []*procOut
	frames     map[frameKey]frame
	pre        map[int]*procOut // images replaced by an exec, by pid (preProc)
	mappings   map[*normalize.Mapping]int32
	kernMaps   map[string]int32 // module ("" for vmlinux) -> mapping
	refreshed  map[int]bool
	execSynced map[int]struct{}                  // processes whose exec time was read for this drain
	vdso       map[*normalize.Mapping]*vdsoImage // nil: unreadable
	kinfo      kernel.Info
	kinfoRead  bool
	rep        Report
	locScratch []int32
	reasons    map[string]string   // off CPU: reason by kernel stack
	labels     map[labelSet]string // Go label sets read in this report
	links      map[string]int32    // link_table index by label set (links.go)
}

type labelSet struct {
	pid int
	ptr uint64
}

type frameKey struct {
	pid    int  // 0 for kernel frames
	pre    bool // of the image pid ran before its exec (procOut.pre)
	addr   uint64
	kernel bool
	rtKind uint8 // a runtime frame: its kind, addr its Ptr and aux its Aux
	aux    uint64
}

// frame is a built location plus what the logs say about it.
type frame struct {
	loc  int32
	addr uint64
	file string
	gnu  string // build ids of the file, for the logs
	goID string
	htl  string
	typ  string
	fn   string
}

type procOut struct {
	pid int
	p   *normalize.Process // nil when the process was never read
	// pre: the image pid ran before an exec this report also saw, p the
	// snapshot read of it then (never refreshed).
	pre   bool
	comm  string
	rows  map[rowKey]*row
	order []*row

	jit     *perfmap.Map // nil without a perf map
	jitRead bool

	cpuRows, offRows int // rows added, by origin
}

type rowKey struct {
	tid, cpu uint32
	comm     string
	stack    int32
	stop     sampler.StopReason
	origin   sampler.Origin
	reason   string // off CPU: why it waited
	labels   string // Go pprof labels: key NUL value NUL ..., sorted by key
	span     span   // the span the thread published (OTEP 4947), zero: none
}

type row struct {
	rowKey
	count    uint64
	first    int64
	frames   []frame // for logs
	ns       uint64  // off CPU: estimated time
	variance float64 // off CPU: of that estimate, ns^2
}

func newRun(b *Builder, start, end time.Time) *run {
	prof := pprofile.NewProfiles()
	return &run{
		b: b, start: start, end: end, prof: prof, dict: pdict.New(prof.Dictionary()),
		procs: map[int]*procOut{}, frames: map[frameKey]frame{}, mappings: map[*normalize.Mapping]int32{},
		kernMaps: map[string]int32{}, refreshed: map[int]bool{}, execSynced: map[int]struct{}{}, vdso: map[*normalize.Mapping]*vdsoImage{},
		rep: Report{Profiles: prof, Logs: plog.NewLogs(), Failures: map[string]int64{}, UnwindStops: map[string]int64{}},
	}
}

func (r *run) fail(reason string) { r.rep.Failures[reason]++ }

// addBatch adds the samples of one drain.
func (r *run) addBatch(batch sampler.Batch) {
	clear(r.execSynced)
	for i := range batch.Samples {
		r.add(&batch.Samples[i])
	}
}

// add normalizes one sampler row into its process's aggregated samples.
func (r *run) add(s *sampler.Sample) {
	pid := int(s.Pid)
	if _, ok := r.execSynced[pid]; !ok {
		// Once per process and drain: every sample of the drain was
		// taken before it, so an exec learned now or later in it places
		// them alike.
		r.execSynced[pid] = struct{}{}
		r.b.syncExec(pid)
	}
	var po *procOut
	switch pre, ok := r.b.beforeExec(pid, s.LastNs); {
	case !ok:
		if !r.b.targeted(pid) {
			r.rep.Filtered += s.Count
			return
		}
		po = r.proc(pid, s.Comm)
	case !pre.targeted:
		r.rep.Filtered += s.Count
		return
	case pre.p != nil:
		po = r.preProc(pid, pre.p)
	default:
		// The image it replaced was never read: its user frames would be
		// named in the new one's. Its kernel frames stay.
		c := *s
		c.UserPCs, c.UserExact, c.Runtime, c.GoLabels, c.Stop = nil, nil, nil, 0, sampler.StopExec
		s = &c
		po = r.proc(pid, s.Comm)
	}
	var frames []frame
	locs := r.locScratch[:0]
	for i, pc := range s.KernelPCs {
		f := r.kernelFrame(pc, i > 0)
		locs = append(locs, f.loc)
		frames = append(frames, f)
	}
	for i, pc := range s.UserPCs {
		var f frame
		if pc&sampler.RuntimeMark != 0 {
			if j := pc &^ sampler.RuntimeMark; j < uint64(len(s.Runtime)) {
				f = r.runtimeFrame(po, s.Runtime[j])
			} else {
				continue // not from a drain
			}
		} else {
			f = r.userFrame(po, pc, i > 0 && !slices.Contains(s.UserExact, uint8(i)))
		}
		locs = append(locs, f.loc)
		frames = append(frames, f)
	}
	r.locScratch = locs
	k := rowKey{tid: s.Tid, cpu: s.CPU, comm: s.Comm, stack: r.dict.Stack(locs), stop: s.Stop}
	if s.GoLabels != 0 && !po.pre {
		k.labels = r.goLabels(pid, s.GoLabels)
	}
	k.span = span{trace: s.TraceID, span: s.SpanID}
	if s.Origin == sampler.OriginOffCPU {
		k.origin, k.cpu, k.reason = s.Origin, 0, r.offCPUReason(s)
	}
	if s.Stop != sampler.StopFramePointers {
		r.rep.UnwindStops[s.Stop.String()] += int64(s.Count)
	}
	rw := po.rows[k]
	if rw == nil {
		rw = &row{rowKey: k, first: s.FirstNs}
		if r.b.opt.Logs {
			rw.frames = frames
		}
		po.rows[k] = rw
		po.order = append(po.order, rw)
	}
	rw.count += s.Count
	rw.first = min(rw.first, s.FirstNs)
	if s.Origin == sampler.OriginOffCPU {
		rw.ns += s.OffCPUNs
		rw.variance += s.OffCPUVar
		po.offRows++
		r.rep.OffCPUWaits += s.Count
		r.rep.OffCPUNs += s.OffCPUNs
		return
	}
	po.cpuRows++
	r.rep.Samples += s.Count
}

// proc returns the output state of pid, using the snapshot taken when the
// process was first seen (or reading one now if it is still alive).
func (r *run) proc(pid int, comm string) *procOut {
	if po := r.procs[pid]; po != nil {
		return po
	}
	po := &procOut{pid: pid, comm: comm, rows: map[rowKey]*row{}}
	p := r.b.norm.Cached(pid)
	if p == nil {
		p, _ = r.b.norm.Process(pid)
	}
	if p != nil {
		po.p = p
		po.comm = p.Comm
	}
	r.b.mu.Lock()
	r.b.lastSeen[pid] = r.b.reports
	r.b.mu.Unlock()
	r.procs[pid] = po
	r.order = append(r.order, po)
	return po
}

// preProc is proc for the image pid ran before its exec, with p the
// snapshot read of it then.
func (r *run) preProc(pid int, p *normalize.Process) *procOut {
	if po := r.pre[pid]; po != nil {
		return po
	}
	po := &procOut{pid: pid, p: p, comm: p.Comm, pre: true, rows: map[rowKey]*row{}}
	if r.pre == nil {
		r.pre = map[int]*procOut{}
	}
	r.pre[pid] = po
	r.order = append(r.order, po)
	return po
}

// finish writes one ResourceProfiles (and ResourceLogs) per process.
func (r *run) finish() Report {
	for _, po := range r.order {
		r.writeProfile(po)
		if r.b.opt.Logs {
			r.writeLogs(po)
		}
	}
	return r.rep
}

func (r *run) fillResource(res pcommon.Resource, po *procOut) {
	a := res.Attributes()
	a.PutInt(pframe.AttrPID, int64(po.pid))
	name, path := po.comm, ""
	if po.p != nil && po.p.ExePath != "" {
		path = po.p.ExePath
		name = filepath.Base(path)
	}
	a.PutStr(pframe.AttrExeName, name)
	if path != "" {
		a.PutStr(pframe.AttrExePath, path)
	}
	if po.p != nil {
		if po.p.VPID != 0 {
			a.PutInt(pframe.AttrVPID, int64(po.p.VPID))
		}
		if po.p.ContainerID != "" {
			a.PutStr(pframe.AttrContainerID, po.p.ContainerID)
		}
		if po.p.ContainerRuntime != "" {
			a.PutStr(pframe.AttrContainerRuntime, po.p.ContainerRuntime)
		}
		if po.p.PodUID != "" {
			a.PutStr(pframe.AttrK8sPodUID, po.p.PodUID)
		}
	}
	if r.b.opt.HostName != "" {
		a.PutStr(pframe.AttrHostName, r.b.opt.HostName)
	}
	if r.b.opt.KernelRelease != "" {
		a.PutStr(pframe.AttrKernelRelease, r.b.opt.KernelRelease)
	}
}

// writeProfile writes po's profiles: CPU, off-CPU and wall-clock, each
// when it has samples, in one resource.
func (r *run) writeProfile(po *procOut) {
	rp := r.prof.ResourceProfiles().AppendEmpty()
	r.fillResource(rp.Resource(), po)
	sp := rp.ScopeProfiles().AppendEmpty()
	sp.Scope().SetName(ScopeName)
	sp.Scope().SetVersion(r.b.opt.ScopeVersion)
	if po.cpuRows > 0 {
		r.writeCPU(sp, po)
	}
	if po.offRows > 0 {
		r.writeOffCPU(sp, po)
		if r.b.opt.Wall {
			r.writeWall(sp, po)
		}
	}
}

func (r *run) writeCPU(sp pprofile.ScopeProfiles, po *procOut) {
	p := sp.Profiles().AppendEmpty()
	p.SetProfileID(newProfileID())
	p.SampleType().SetTypeStrindex(r.dict.String("samples"))
	p.SampleType().SetUnitStrindex(r.dict.String("count"))
	p.PeriodType().SetTypeStrindex(r.dict.String("cpu"))
	p.PeriodType().SetUnitStrindex(r.dict.String("nanoseconds"))
	p.SetPeriod(int64(time.Second) / int64(r.b.opt.SampleRate))
	p.SetTime(pcommon.NewTimestampFromTime(r.start))
	p.SetDurationNano(uint64(max(r.end.Sub(r.start), 0)))
	ss := p.Samples()
	ss.EnsureCapacity(po.cpuRows)
	for _, rw := range po.order {
		if rw.origin != sampler.OriginCPU {
			continue
		}
		s := ss.AppendEmpty()
		s.SetStackIndex(rw.stack)
		s.Values().Append(int64(rw.count))
		s.TimestampsUnixNano().Append(uint64(rw.first))
		s.AttributeIndices().Append(
			r.dict.AttrInt(pframe.AttrThreadID, int64(rw.tid)),
			r.dict.AttrStr(pframe.AttrThreadName, rw.comm),
			r.dict.AttrInt(pframe.AttrCPU, int64(rw.cpu)))
		if rw.stop != sampler.StopOK && rw.stop != sampler.StopFramePointers {
			s.AttributeIndices().Append(r.dict.AttrStr(pframe.AttrUnwindStop, rw.stop.String()))
		}
		r.labelAttrs(s, rw)
		r.rep.Rows++
	}
}

// LabelReader is the part of runtimes.Set that reads the Go pprof labels
// samples point at.
type LabelReader interface {
	Labels(pid int, ptr uint64) []runtimes.Label
}

// goLabels returns the label set at ptr in pid as a row key part, read
// once per report: a set at the same address in the next report may be
// another one.
func (r *run) goLabels(pid int, ptr uint64) string {
	lr, ok := r.b.opt.Runtimes.(LabelReader)
	if !ok {
		return ""
	}
	k := labelSet{pid, ptr}
	if s, ok := r.labels[k]; ok {
		return s
	}
	if r.labels == nil {
		r.labels = map[labelSet]string{}
	}
	var b strings.Builder
	for _, l := range lr.Labels(pid, ptr) {
		// NUL ends a key or value here: cut at one a process put in.
		k, _, _ := strings.Cut(l.Key, "\x00")
		v, _, _ := strings.Cut(l.Value, "\x00")
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(v)
		b.WriteByte(0)
	}
	r.labels[k] = b.String()
	return r.labels[k]
}
