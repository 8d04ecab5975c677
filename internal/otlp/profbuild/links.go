package profbuild

import (
	"encoding/hex"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
)

// Go pprof label keys that name a sample's span: Grafana's otel-profiling-go
// (a wrapper of the OpenTelemetry Go SDK's TracerProvider) sets trace_id on
// a goroutine's local root span and span_id to that span (or, with
// ScopeAllSpans, to the current one), both as lowercase hex.
const (
	labelTraceID = "trace_id"
	labelSpanID  = "span_id"
)

// spanOf returns the span a sample's Go labels (key NUL value NUL ...)
// name: both ids present, of 32 and 16 hex digits, and not zero. Anything
// else names no span; the labels stay attributes either way.
func spanOf(labels string) (pcommon.TraceID, pcommon.SpanID, bool) {
	var tr pcommon.TraceID
	var sp pcommon.SpanID
	var haveTr, haveSp bool
	for rest := labels; rest != ""; {
		var k, v string
		k, rest, _ = strings.Cut(rest, "\x00")
		v, rest, _ = strings.Cut(rest, "\x00")
		switch k {
		case labelTraceID:
			haveTr = len(v) == 2*len(tr) && decodeHex(tr[:], v)
		case labelSpanID:
			haveSp = len(v) == 2*len(sp) && decodeHex(sp[:], v)
		}
	}
	if !haveTr || !haveSp || tr.IsEmpty() || sp.IsEmpty() {
		return tr, sp, false
	}
	return tr, sp, true
}

func decodeHex(dst []byte, s string) bool {
	n, err := hex.Decode(dst, []byte(s))
	return err == nil && n == len(dst)
}

// link returns the link_table index of the span rw's labels name, 0 for
// none; one parse per label set and report.
func (r *run) link(labels string) int32 {
	if labels == "" {
		return 0
	}
	if i, ok := r.links[labels]; ok {
		return i
	}
	var i int32
	if tr, sp, ok := spanOf(labels); ok {
		i = r.dict.Link(tr, sp)
	}
	if r.links == nil {
		r.links = map[string]int32{}
	}
	r.links[labels] = i
	return i
}

// span is the trace and span ids a thread published through the
// OpenTelemetry thread context (OTEP 4947) as the sample was taken.
type span struct {
	trace [16]byte
	span  [8]byte
}

// valid says whether s names a span: both ids set, as the OTEP has a
// writer set them together.
func (s span) valid() bool {
	return pcommon.TraceID(s.trace) != pcommon.NewTraceIDEmpty() && pcommon.SpanID(s.span) != pcommon.NewSpanIDEmpty()
}

// labelAttrs gives a sample of rw its Go labels, as pprof.label.<key>
// attributes, and the link of the span its thread published or, failing
// that, of the span its labels name.
func (r *run) labelAttrs(s pprofile.Sample, rw *row) {
	for rest := rw.labels; rest != ""; {
		var k, v string
		k, rest, _ = strings.Cut(rest, "\x00")
		v, rest, _ = strings.Cut(rest, "\x00")
		s.AttributeIndices().Append(r.dict.AttrStr(pframe.AttrPprofLabelPrefix+k, v))
	}
	if rw.span.valid() {
		s.SetLinkIndex(r.dict.Link(rw.span.trace, rw.span.span))
		return
	}
	if li := r.link(rw.labels); li != 0 {
		s.SetLinkIndex(li)
	}
}
