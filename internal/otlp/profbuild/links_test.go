package profbuild

import (
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/otlp/pdict"
)

func labelString(kv ...string) string { return strings.Join(kv, "\x00") + "\x00" }

func TestSpanOf(t *testing.T) {
	const tr, sp = "8eb5f51bdee0f4b191238bb0a0d4fd1a", "714df6b6cf0f0ea3"
	for _, c := range []struct {
		name   string
		labels string
		ok     bool
	}{
		{"both", labelString("span_id", sp, "span_name", "request", "trace_id", tr), true},
		{"upper case hex", labelString("span_id", strings.ToUpper(sp), "trace_id", strings.ToUpper(tr)), true},
		{"span only (JFR-like)", labelString("span_id", sp), false},
		{"trace only", labelString("trace_id", tr), false},
		{"zero trace", labelString("span_id", sp, "trace_id", strings.Repeat("0", 32)), false},
		{"zero span", labelString("span_id", strings.Repeat("0", 16), "trace_id", tr), false},
		{"short span", labelString("span_id", sp[:15], "trace_id", tr), false},
		{"long trace", labelString("span_id", sp, "trace_id", tr+"00"), false},
		{"not hex", labelString("span_id", "zz4df6b6cf0f0ea3", "trace_id", tr), false},
		{"no labels", "", false},
		{"cut short", "span_id\x00" + sp + "\x00trace_id", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			gotTr, gotSp, ok := spanOf(c.labels)
			if ok != c.ok {
				t.Fatalf("spanOf(%q) ok=%v, want %v", c.labels, ok, c.ok)
			}
			if ok && (gotTr.String() != tr || gotSp.String() != sp) {
				t.Errorf("got %s/%s, want %s/%s", gotTr, gotSp, tr, sp)
			}
		})
	}
}

func TestRunLinks(t *testing.T) {
	p := pprofile.NewProfiles()
	r := &run{dict: pdict.New(p.Dictionary())}
	a := labelString("span_id", "714df6b6cf0f0ea3", "trace_id", "8eb5f51bdee0f4b191238bb0a0d4fd1a")
	b := labelString("span_id", "61e2e5254b591960", "trace_id", "8eb5f51bdee0f4b191238bb0a0d4fd1a")
	// The same span under another label set (span_name added) is one link.
	a2 := labelString("span_id", "714df6b6cf0f0ea3", "span_name", "x", "trace_id", "8eb5f51bdee0f4b191238bb0a0d4fd1a")
	ia, ib, ia2 := r.link(a), r.link(b), r.link(a2)
	if ia <= 0 || ib <= 0 || ia == ib || ia2 != ia {
		t.Fatalf("links %d %d %d: want two distinct non-zero, the third the first", ia, ib, ia2)
	}
	if n := r.link(labelString("request", "a")); n != 0 {
		t.Errorf("labels without a span: link %d, want 0", n)
	}
	lt := p.Dictionary().LinkTable()
	if lt.Len() != 3 || !lt.At(0).TraceID().IsEmpty() || !lt.At(0).SpanID().IsEmpty() {
		t.Fatalf("link table of %d, entry 0 %v/%v: want the empty link and two", lt.Len(), lt.At(0).TraceID(), lt.At(0).SpanID())
	}
	if got := lt.At(int(ib)).SpanID().String(); got != "61e2e5254b591960" {
		t.Errorf("link %d has span %s", ib, got)
	}
}

// FuzzSpanOf: label sets come from a process's memory.
func FuzzSpanOf(f *testing.F) {
	f.Add(labelString("span_id", "714df6b6cf0f0ea3", "trace_id", "8eb5f51bdee0f4b191238bb0a0d4fd1a"))
	f.Add("trace_id\x00")
	f.Add("")
	f.Fuzz(func(t *testing.T, labels string) {
		tr, sp, ok := spanOf(labels)
		if ok && (tr.IsEmpty() || sp.IsEmpty()) {
			t.Fatalf("spanOf(%q): a link with an empty id", labels)
		}
	})
}
