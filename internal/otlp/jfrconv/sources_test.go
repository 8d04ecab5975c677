package jfrconv_test

import (
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// Real JDK 17 recordings of an allocating program. With settings=profile
// plus the TLAB events, the recording holds two estimates of the same
// allocations: alloc is made of jdk.ObjectAllocationSample's weights alone
// (the sum jfr print --json gives), not of that plus the TLAB sizes. With
// the sampler off, alloc is the TLAB events' sizes (tlabSize in a new
// TLAB, allocationSize outside one).
func TestJDKAllocationSources(t *testing.T) {
	const tlab = "jdk.ObjectAllocationInNewTLAB#enabled=true,jdk.ObjectAllocationOutsideTLAB#enabled=true"
	both := jfrtest.RecordJDKWith(t, "Alloc", 1500, "settings=profile,"+tlab)
	only := jfrtest.RecordJDKWith(t, "Alloc", 1500, "settings=profile,jdk.ObjectAllocationSample#enabled=false,"+tlab)

	sampled := jdkSum(t, both, "jdk.ObjectAllocationSample", "weight")
	inTLAB, outTLAB := jdkSum(t, both, "jdk.ObjectAllocationInNewTLAB", "tlabSize"), jdkSum(t, both, "jdk.ObjectAllocationOutsideTLAB", "allocationSize")
	if sampled.events == 0 || inTLAB.events == 0 || outTLAB.events == 0 {
		t.Fatalf("the recording lacks a source: sample %+v, in TLAB %+v, outside %+v", sampled, inTLAB, outTLAB)
	}
	pd, st := convertFile(t, both)
	got := allocTotal(pd)
	t.Logf("both on: alloc %d bytes; jfr print: ObjectAllocationSample %d events %d bytes, TLAB %d+%d events %d bytes",
		got, sampled.events, sampled.sum, inTLAB.events, outTLAB.events, inTLAB.sum+outTLAB.sum)
	if got != sampled.sum {
		t.Errorf("alloc %d bytes, want jdk.ObjectAllocationSample's %d (TLAB events would add %d)", got, sampled.sum, inTLAB.sum+outTLAB.sum)
	}
	if st.Source[jfr.KindAlloc] != "jdk.ObjectAllocationSample" || st.Ignored["jdk.ObjectAllocationInNewTLAB/OutsideTLAB"] != inTLAB.events+outTLAB.events ||
		st.Samples[jfr.KindAlloc] != got {
		t.Errorf("stats %+v", st)
	}
	requireLeaf(t, pd, "Alloc.churn", "Alloc.big")

	in2, out2 := jdkSum(t, only, "jdk.ObjectAllocationInNewTLAB", "tlabSize"), jdkSum(t, only, "jdk.ObjectAllocationOutsideTLAB", "allocationSize")
	if n := jdkSum(t, only, "jdk.ObjectAllocationSample", "weight"); n.events != 0 || in2.events == 0 {
		t.Fatalf("TLAB-only recording: %d samples, %d TLAB events", n.events, in2.events)
	}
	pd, st = convertFile(t, only)
	if got := allocTotal(pd); got != in2.sum+out2.sum || len(st.Source) != 0 || len(st.Ignored) != 0 {
		t.Errorf("TLAB only: alloc %d bytes, want %d+%d; stats %+v", got, in2.sum, out2.sum, st)
	}
	requireLeaf(t, pd, "Alloc.churn", "Alloc.big")
}

type peerSum struct{ events, sum int64 }

// jdkSum sums one numeric field over every event of a type, as jfr print
// --json reads them.
func jdkSum(t *testing.T, file, event, field string) peerSum {
	var doc struct {
		Recording struct {
			Events []struct {
				Values map[string]json.RawMessage `json:"values"`
			} `json:"events"`
		} `json:"recording"`
	}
	if err := json.Unmarshal(jfrtest.PrintJSON(t, file, event), &doc); err != nil {
		t.Fatal(err)
	}
	var s peerSum
	for _, e := range doc.Recording.Events {
		var v int64
		if err := json.Unmarshal(e.Values[field], &v); err != nil {
			t.Fatalf("%s.%s: %v", event, field, err)
		}
		s.events++
		s.sum += v
	}
	return s
}

func convertFile(t *testing.T, path string) (pprofile.Profiles, jfrconv.Stats) {
	f, size := openFile(t, path)
	pd, st, err := jfrconv.Convert(f, size, jfrconv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return pd, st
}

func allocTotal(pd pprofile.Profiles) int64 {
	_, vals := stacks(pd, "space")
	var n int64
	for _, v := range vals {
		n += v
	}
	return n
}

// requireLeaf checks the alloc profile's heaviest Java leaf is first, and
// that the others are there.
func requireLeaf(t *testing.T, pd pprofile.Profiles, first string, others ...string) {
	t.Helper()
	st, vals := stacks(pd, "space")
	byLeaf := map[string]int64{}
	for i, s := range st {
		for _, f := range s {
			if f.typ == "jvm" {
				byLeaf[f.name] += vals[i]
				break
			}
		}
	}
	names := make([]string, 0, len(byLeaf))
	for n := range byLeaf {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return byLeaf[names[i]] > byLeaf[names[j]] })
	if len(names) == 0 || names[0] != first {
		t.Errorf("heaviest allocating leaves %v, want %s first", names[:min(len(names), 5)], first)
	}
	for _, o := range others {
		if byLeaf[o] == 0 {
			t.Errorf("no allocation in %s: %v", o, names[:min(len(names), 5)])
		}
	}
}

// The Datadog profiler's span ids, and Pyroscope's span name, become
// sample attributes in the hex form traces use; samples in different spans
// stay apart, and samples outside any span carry none.
func TestTraceContext(t *testing.T) {
	r := jfrtest.New(1_700_000_000_000_000_000)
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	const span, root = 0x1a2b3c4d5e6f7081, -0x0123456789abcdf0 // ids are unsigned 64-bit in a signed long
	r.SampleIn(jfrtest.DatadogExecutionSample, 10, 1, 1, span, root, nil, java)
	r.SampleIn(jfrtest.DatadogExecutionSample, 20, 1, 1, span, root, nil, java)
	r.SampleIn(jfrtest.DatadogExecutionSample, 30, 1, 1, 7, 7, nil, java)
	r.Sample(jfrtest.DatadogExecutionSample, 40, 1, 1, java)
	pd, _, err := jfrconv.ConvertBytes(r.Bytes(), jfrconv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := samplesByAttrs(pd)
	want := map[string]int64{
		"local_root_span_id=fedcba9876543210,span_id=1a2b3c4d5e6f7081": 2,
		"local_root_span_id=0000000000000007,span_id=0000000000000007": 1,
		"": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("samples by trace context %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("samples by trace context %v, want %v", got, want)
		}
	}
	if n := pd.Dictionary().LinkTable().Len(); n > 1 {
		t.Errorf("%d links without a trace id", n)
	}
}

// samplesByAttrs sums the first profile's values by their non-thread
// attributes, rendered sorted as k=v,k=v.
func samplesByAttrs(pd pprofile.Profiles) map[string]int64 {
	d := pdict.New(pd.Dictionary())
	got := map[string]int64{}
	for _, s := range pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0).Samples().All() {
		var kv []string
		for _, ai := range s.AttributeIndices().All() {
			k, v, _ := d.Attr(ai)
			if !strings.HasPrefix(k, "thread.") {
				kv = append(kv, k+"="+v.AsString())
			}
		}
		sort.Strings(kv)
		got[strings.Join(kv, ",")] += s.Values().At(0)
	}
	return got
}

func openFile(t *testing.T, path string) (*os.File, int64) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return f, fi.Size()
}
