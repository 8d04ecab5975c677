package profbuild

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
)

// logFrame is one element of the ProfileEvent "frames" attribute, as
// internal/otlp/otlpsym reads it.
type logFrame struct {
	BuildID   string `json:"buildId,omitempty"`
	GoBuildID string `json:"goBuildId,omitempty"`
	FileID    string `json:"fileId,omitempty"` // htlhash
	Address   uint64 `json:"address"`
	File      string `json:"file,omitempty"`
	FrameType string `json:"frameType"`
	Function  string `json:"function,omitempty"`
}

// writeLogs emits one ProfileEvent record per aggregated sample of po.
func (r *run) writeLogs(po *procOut) {
	rl := r.rep.Logs.ResourceLogs().AppendEmpty()
	r.fillResource(rl.Resource(), po)
	sl := rl.ScopeLogs().AppendEmpty()
	sl.Scope().SetName(ScopeName)
	sl.Scope().SetVersion(r.b.opt.ScopeVersion)
	now := pcommon.NewTimestampFromTime(time.Now())
	recs := sl.LogRecords()
	recs.EnsureCapacity(len(po.order))
	for _, rw := range po.order {
		lr := recs.AppendEmpty()
		lr.SetTimestamp(pcommon.Timestamp(rw.first))
		lr.SetObservedTimestamp(now)
		a := lr.Attributes()
		event, typ, weight := "ebpf.CPUSample", "cpu", int64(rw.count)
		if rw.origin == sampler.OriginOffCPU {
			// Weighted by the time the waits stand for, in ns.
			event, typ, weight = "ebpf.OffCPUSample", TypeOffCPU, int64(rw.ns)
		}
		a.PutStr("eventType", event)
		a.PutStr("profileType", typ)
		a.PutStr("profileSource", "ebpf")
		a.PutInt("pid", int64(po.pid))
		a.PutInt("tid", int64(rw.tid))
		a.PutStr("comm", po.comm)
		a.PutStr("threadName", rw.comm)
		if rw.origin == sampler.OriginOffCPU {
			a.PutStr("offCpuReason", rw.reason)
		} else {
			a.PutInt("cpu", int64(rw.cpu))
		}
		a.PutInt("sampleWeight", weight)
		a.PutInt("totalSamples", int64(rw.count))
		a.PutInt("stackDepth", int64(len(rw.frames)))
		a.PutStr("frames", framesJSON(rw.frames))
		top := ""
		if len(rw.frames) > 0 && rw.frames[0].fn != "" {
			top = rw.frames[0].fn
			a.PutStr("topFunction", top)
			if class, method := splitMethod(rw.frames[0]); method != "" {
				a.PutStr("topMethod", method)
				a.PutStr("topClass", class)
			}
		} else if len(rw.frames) > 0 {
			top = "0x" + strconv.FormatUint(rw.frames[0].addr, 16)
		}
		lr.Body().SetStr(po.comm + "[" + strconv.Itoa(po.pid) + "]: " + top)
	}
}

func framesJSON(fs []frame) string {
	out := make([]logFrame, len(fs))
	for i, f := range fs {
		out[i] = logFrame{
			BuildID: f.gnu, GoBuildID: f.goID, FileID: f.htl, Address: f.addr,
			File: f.file, FrameType: f.typ, Function: f.fn,
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// splitMethod splits a JIT frame's name into class and method
// ("Lcom/x/Y;::run", "com.x.Y::run", "void com.x.Y.run(int)"); other
// frames have no class.
func splitMethod(f frame) (class, method string) {
	switch f.typ {
	case pframe.TypeJVM, pframe.TypeV8JS, pframe.TypeDotnet:
	default:
		return "", ""
	}
	name := f.fn
	if i := strings.IndexByte(name, '('); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndexByte(name, ' '); i >= 0 {
		name = name[i+1:]
	}
	if c, m, ok := strings.Cut(name, "::"); ok {
		if strings.HasPrefix(c, "L") && strings.HasSuffix(c, ";") {
			c = c[1 : len(c)-1] // JVM descriptor
		}
		return c, m
	}
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		return name[:i], name[i+1:]
	}
	return "", name
}
