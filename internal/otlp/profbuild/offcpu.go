package profbuild

import (
	"math"
	"time"
	"unsafe"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/addrmap"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/sampler"
)

// Profile types of the off-CPU and wall-clock profiles
// (docs/frame-format.md): values in nanoseconds.
const (
	TypeOffCPU = "off_cpu"
	TypeWall   = "wall"
	UnitNanos  = "nanoseconds"
)

// offCPUReason tells why the thread of an off-CPU row waited, from the
// names of its kernel frames (once per distinct kernel stack and report).
func (r *run) offCPUReason(s *sampler.Sample) string {
	if s.Runnable {
		return offcpu.Reason(nil, true)
	}
	var key string
	if len(s.KernelPCs) > 0 {
		key = unsafe.String((*byte)(unsafe.Pointer(&s.KernelPCs[0])), 8*len(s.KernelPCs))
	}
	if reason, ok := r.reasons[key]; ok {
		return reason
	}
	names := make([]string, 0, len(s.KernelPCs))
	for i, pc := range s.KernelPCs {
		if i > 0 {
			pc = addrmap.ReturnAddressAdjust(pc)
		}
		if name, _, _, ok := r.b.kern.Lookup(pc); ok {
			names = append(names, name)
		}
	}
	reason := offcpu.Reason(names, false)
	if len(s.KernelPCs) > 0 && len(names) == 0 {
		reason = offcpu.ReasonUnknown // kallsyms names none of them
	}
	if r.reasons == nil {
		r.reasons = map[string]string{}
	}
	r.reasons[string([]byte(key))] = reason // the key aliases the batch's memory
	return reason
}

// newProfile appends a profile of one type whose values are nanoseconds.
func (r *run) newProfile(sp pprofile.ScopeProfiles, typ string) pprofile.Profile {
	p := sp.Profiles().AppendEmpty()
	p.SetProfileID(newProfileID())
	p.SampleType().SetTypeStrindex(r.dict.String(typ))
	p.SampleType().SetUnitStrindex(r.dict.String(UnitNanos))
	p.PeriodType().SetTypeStrindex(r.dict.String(typ))
	p.PeriodType().SetUnitStrindex(r.dict.String(UnitNanos))
	p.SetPeriod(1)
	p.SetTime(pcommon.NewTimestampFromTime(r.start))
	p.SetDurationNano(uint64(max(r.end.Sub(r.start), 0)))
	return p
}

// sampleAttrs gives a sample of rw its thread, reason and stop reason.
func (r *run) sampleAttrs(s pprofile.Sample, rw *row) {
	a := s.AttributeIndices()
	a.Append(r.dict.AttrInt(pframe.AttrThreadID, int64(rw.tid)), r.dict.AttrStr(pframe.AttrThreadName, rw.comm))
	if rw.reason != "" {
		a.Append(r.dict.AttrStr(pframe.AttrOffCPUReason, rw.reason))
	}
	if rw.stop != sampler.StopOK && rw.stop != sampler.StopFramePointers {
		a.Append(r.dict.AttrStr(pframe.AttrUnwindStop, rw.stop.String()))
	}
}

// writeOffCPU writes po's off-CPU profile: per thread, stack and reason,
// the estimated time spent waiting there.
func (r *run) writeOffCPU(sp pprofile.ScopeProfiles, po *procOut) {
	p := r.newProfile(sp, TypeOffCPU)
	ss := p.Samples()
	ss.EnsureCapacity(po.offRows)
	for _, rw := range po.order {
		if rw.origin != sampler.OriginOffCPU {
			continue
		}
		s := ss.AppendEmpty()
		s.SetStackIndex(rw.stack)
		s.Values().Append(int64(rw.ns))
		s.TimestampsUnixNano().Append(uint64(rw.first))
		r.sampleAttrs(s, rw)
		r.labelAttrs(s, rw)
		s.AttributeIndices().Append(r.dict.AttrInt(pframe.AttrOffCPUWaits, int64(rw.count)))
		if sd := math.Sqrt(rw.variance); sd >= 1 {
			s.AttributeIndices().Append(r.dict.AttrInt(pframe.AttrOffCPUStderr, int64(sd)))
		}
		r.rep.Rows++
	}
}

// writeWall writes po's wall-clock profile, fgprof-style: CPU samples
// count 1/sample_rate seconds each, waits their estimated time, so each
// thread's samples add up to the time it lived in the interval (less its
// waits shorter than min_wait).
func (r *run) writeWall(sp pprofile.ScopeProfiles, po *procOut) {
	p := r.newProfile(sp, TypeWall)
	period := uint64(time.Second) / uint64(r.b.opt.SampleRate)
	type wallKey struct {
		tid          uint32
		comm, reason string
		stack        int32
		stop         sampler.StopReason
		labels       string
	}
	idx := map[wallKey]int{}
	ss := p.Samples()
	for _, rw := range po.order {
		v := rw.ns
		if rw.origin == sampler.OriginCPU {
			v = rw.count * period
		}
		k := wallKey{rw.tid, rw.comm, rw.reason, rw.stack, rw.stop, rw.labels}
		if i, ok := idx[k]; ok {
			vals := ss.At(i).Values()
			vals.SetAt(0, vals.At(0)+int64(v))
			continue
		}
		idx[k] = ss.Len()
		s := ss.AppendEmpty()
		s.SetStackIndex(rw.stack)
		s.Values().Append(int64(v))
		s.TimestampsUnixNano().Append(uint64(rw.first))
		r.sampleAttrs(s, rw)
		r.labelAttrs(s, rw)
	}
}
