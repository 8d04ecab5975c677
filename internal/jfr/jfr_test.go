package jfr_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/jfr/jfrtest"
)

const buildID = "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b"

func sampleRecording(uncompressed bool) *jfrtest.Recording {
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.Uncompressed = uncompressed
	r.Library(jfrtest.Library{Name: "/opt/lib/libnative.so", Base: 0x7f0000001000, Top: 0x7f0000009000, BuildID: buildID, LoadBias: 0x7f0000000000})
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	r.Sample(jfrtest.DatadogExecutionSample, 1000, 7, 1, jfrtest.RemoteFrame(buildID, 0x1a2b), jfrtest.RemoteFrame(buildID, 0x1000), jfrtest.NativeFrame("JNI_Call"), java)
	r.Sample(jfrtest.DatadogExecutionSample, 2000, 7, 3, java)
	r.Sample(jfrtest.DatadogMethodSample, 3000, 8, 1, java)
	r.Alloc(4000, 8, "byte[]", 64, 2.5, java)
	return r
}

type collected struct {
	samples []jfr.Sample
	libs    []jfr.NativeLibrary
	leaf    []string
	types   []string
}

func parse(t *testing.T, b []byte) (collected, error) {
	var c collected
	err := jfr.ParseBytes(b, jfr.Options{}, jfr.Visitor{
		Sample: func(ch *jfr.Chunk, s *jfr.Sample) error {
			c.samples = append(c.samples, *s)
			st, ok := ch.Stack(s.Stack)
			if !ok {
				t.Errorf("sample refers to unknown stack %d", s.Stack)
				return nil
			}
			var names []string
			for _, f := range st.Frames {
				m, _ := ch.Method(f.Method)
				ft, known := ch.FrameType(f.Type)
				if !known {
					ft = "raw:" + string(rune('0'+f.Type))
				}
				names = append(names, ch.ClassName(m.Class)+"|"+ch.Symbol(m.Name)+"|"+ch.Symbol(m.Descriptor)+"|"+ft)
			}
			c.leaf = append(c.leaf, strings.Join(names, " <- "))
			return nil
		},
		NativeLibrary: func(_ *jfr.Chunk, l *jfr.NativeLibrary) error { c.libs = append(c.libs, *l); return nil },
	})
	return c, err
}

func TestRoundTrip(t *testing.T) {
	for _, unc := range []bool{false, true} {
		b := sampleRecording(unc).Bytes()
		c, err := parse(t, b)
		if err != nil {
			t.Fatalf("uncompressed=%v: %v", unc, err)
		}
		if len(c.samples) != 4 {
			t.Fatalf("got %d samples", len(c.samples))
		}
		kinds := []jfr.Kind{jfr.KindCPU, jfr.KindCPU, jfr.KindWall, jfr.KindAlloc}
		weights := []int64{1, 3, 1, 160}
		for i, s := range c.samples {
			if s.Kind != kinds[i] || s.Weight != weights[i] {
				t.Errorf("sample %d: kind %v weight %d, want %v %d", i, s.Kind, s.Weight, kinds[i], weights[i])
			}
		}
		if got := c.samples[0].Time; got != 1_700_000_000_000_001_000 {
			t.Errorf("time %d", got)
		}
		want := buildID + "|<remote>|0x1a2b|raw:7 <- " + buildID + "|<remote>|0x1000|raw:7 <- |JNI_Call|()L;|Native <- com/example/App|run|()V|JIT compiled"
		if c.leaf[0] != want {
			t.Errorf("stack\n got %s\nwant %s", c.leaf[0], want)
		}
		if len(c.libs) != 1 || c.libs[0].BuildID != buildID || c.libs[0].LoadBias != 0x7f0000000000 || !c.libs[0].HasBuildID {
			t.Errorf("libraries %+v", c.libs)
		}
	}
}

// The JDK's own tool reads what jfrtest writes: the writer is a faithful
// peer, not a format of our own.
func TestWriterReadByJDK(t *testing.T) {
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.ContextAttributes = []string{"http.route"}
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	r.SampleWith(jfrtest.DatadogExecutionSample, 1000, 7, 1, map[string]string{"http.route": "/cart"}, jfrtest.NativeFrame("JNI_Call"), java)
	r.Sample(jfrtest.JDKExecutionSample, 2000, 7, 1, java)
	f := filepath.Join(t.TempDir(), "w.jfr")
	os.WriteFile(f, r.Bytes(), 0o644)
	var doc struct {
		Recording struct {
			Events []struct {
				Type   string `json:"type"`
				Values struct {
					StackTrace struct {
						Frames []struct {
							Method struct {
								Name struct {
									String string `json:"string"`
								} `json:"name"`
							} `json:"method"`
							LineNumber int `json:"lineNumber"`
						} `json:"frames"`
					} `json:"stackTrace"`
					Route struct {
						Value string `json:"value"`
					} `json:"http.route"`
				} `json:"values"`
			} `json:"events"`
		} `json:"recording"`
	}
	if err := json.Unmarshal(jfrtest.PrintJSON(t, f), &doc); err != nil {
		t.Fatal(err)
	}
	ev := doc.Recording.Events
	if len(ev) != 2 || ev[0].Type != "datadog.ExecutionSample" || ev[1].Type != "jdk.ExecutionSample" ||
		len(ev[0].Values.StackTrace.Frames) != 2 || ev[0].Values.StackTrace.Frames[1].LineNumber != 42 ||
		ev[0].Values.StackTrace.Frames[0].Method.Name.String != "JNI_Call" || ev[0].Values.Route.Value != "/cart" {
		t.Fatalf("jfr print read %+v", ev)
	}
}

func TestJDKRecording(t *testing.T) {
	path := jfrtest.RecordJDK(t, 1500)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	leaf := map[string]int{}
	var n int
	err = jfr.ParseBytes(b, jfr.Options{}, jfr.Visitor{Sample: func(c *jfr.Chunk, s *jfr.Sample) error {
		if s.EventType != "jdk.ExecutionSample" {
			return nil
		}
		n++
		st, _ := c.Stack(s.Stack)
		m, _ := c.Method(st.Frames[0].Method)
		leaf[frame.JavaMethod(c.ClassName(m.Class), c.Symbol(m.Name))]++
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Recording struct {
			Events []json.RawMessage `json:"events"`
		} `json:"recording"`
	}
	if err := json.Unmarshal(jfrtest.PrintJSON(t, path, "jdk.ExecutionSample"), &doc); err != nil {
		t.Fatal(err)
	}
	if n == 0 || n != len(doc.Recording.Events) {
		t.Fatalf("%d execution samples, jfr print has %d", n, len(doc.Recording.Events))
	}
	if leaf["Hot.spin"] < n/2 {
		t.Errorf("Hot.spin is the leaf of %d of %d samples: %v", leaf["Hot.spin"], n, leaf)
	}
}

// Every kind of bad input gets an error saying why, never a panic or hang.
func TestHostile(t *testing.T) {
	good, lay := sampleRecording(false).Build()
	mut := func(f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), good...))
	}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, jfr.ErrCorrupt},
		{"wrong magic", mut(func(b []byte) []byte { copy(b, "PK\x03\x04"); return b }), jfr.ErrCorrupt},
		{"gzip", []byte{0x1f, 0x8b, 8, 0}, jfr.ErrCorrupt},
		{"header only", good[:68], jfr.ErrTruncated},
		{"truncated chunk", good[:len(good)/2], jfr.ErrTruncated},
		{"huge chunk size", mut(func(b []byte) []byte { binary.BigEndian.PutUint64(b[8:], 1<<62); return b }), jfr.ErrLimit},
		{"chunk size too small", mut(func(b []byte) []byte { binary.BigEndian.PutUint64(b[8:], 10); return b }), jfr.ErrCorrupt},
		{"metadata offset outside", mut(func(b []byte) []byte { binary.BigEndian.PutUint64(b[24:], 1<<40); return b }), jfr.ErrCorrupt},
		{"cp offset at metadata", mut(func(b []byte) []byte { binary.BigEndian.PutUint64(b[16:], uint64(lay.MetaOffset)); return b }), jfr.ErrCorrupt},
		{"zero ticks per second", mut(func(b []byte) []byte { binary.BigEndian.PutUint64(b[56:], 0); return b }), jfr.ErrCorrupt},
		{"unfinished chunk", mut(func(b []byte) []byte { b[64] = 255; return b }), jfr.ErrTruncated},
		{"version 9", mut(func(b []byte) []byte { b[5] = 9; return b }), jfr.ErrCorrupt},
		{"cp chain forward (cycle)", cpDelta(+1), jfr.ErrCorrupt},
		{"cp chain before the header", cpDelta(-1 << 20), jfr.ErrCorrupt},
		{"event size zero", mut(func(b []byte) []byte {
			b[lay.FirstEvent], b[lay.FirstEvent+1], b[lay.FirstEvent+2], b[lay.FirstEvent+3] = 0x80, 0x80, 0x80, 0
			return b
		}), jfr.ErrCorrupt},
		{"event size huge", mut(func(b []byte) []byte { b[lay.FirstEvent+3] = 0x7f; return b }), jfr.ErrCorrupt},
	}
	for _, tc := range cases {
		_, err := parse(t, tc.in)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
	// Every prefix of a valid file fails cleanly.
	for n := 0; n < len(good); n += 7 {
		if _, err := parse(t, good[:n]); err == nil {
			t.Fatalf("prefix of %d bytes parsed", n)
		}
	}
}

// cpDelta writes a recording (fixed-width integers) whose constant-pool
// event's delta points delta bytes away from itself.
func cpDelta(delta int64) []byte {
	b, lay := sampleRecording(true).Build()
	// Uncompressed: size(4) type(8) start(8) duration(8) delta(8).
	binary.BigEndian.PutUint64(b[lay.CPOffset+4+24:], uint64(delta))
	return b
}

func TestLimits(t *testing.T) {
	r := jfrtest.New(0)
	long := strings.Repeat("x", 4096)
	r.Sample(jfrtest.DatadogExecutionSample, 1, 1, 1, jfrtest.NativeFrame(long))
	b := r.Bytes()
	lim := jfr.DefaultLimits()
	lim.MaxStringLen = 1024
	err := jfr.ParseBytes(b, jfr.Options{Limits: lim}, jfr.Visitor{})
	if !errors.Is(err, jfr.ErrLimit) {
		t.Errorf("long string: %v", err)
	}
	frames := make([]jfrtest.Frame, 300)
	for i := range frames {
		frames[i] = jfrtest.NativeFrame("f")
	}
	r = jfrtest.New(0)
	r.Sample(jfrtest.DatadogExecutionSample, 1, 1, 1, frames...)
	lim = jfr.DefaultLimits()
	lim.MaxArrayLen = 256
	if err := jfr.ParseBytes(r.Bytes(), jfr.Options{Limits: lim}, jfr.Visitor{}); !errors.Is(err, jfr.ErrLimit) {
		t.Errorf("deep stack: %v", err)
	}
	lim = jfr.DefaultLimits()
	lim.MaxPoolEntries = 3
	if err := jfr.ParseBytes(b, jfr.Options{Limits: lim}, jfr.Visitor{}); !errors.Is(err, jfr.ErrLimit) {
		t.Errorf("pool entries: %v", err)
	}
}

func TestConcatenatedChunks(t *testing.T) {
	a := sampleRecording(false).Bytes()
	b := sampleRecording(true).Bytes()
	c, err := parse(t, append(append([]byte(nil), a...), b...))
	if err != nil || len(c.samples) != 8 {
		t.Fatalf("%d samples, %v", len(c.samples), err)
	}
}

// Chunks with different type systems, one after another: each chunk is read
// with its own metadata (the reader reuses parsed metadata only when a
// chunk repeats it byte for byte).
func TestChunksWithDifferentMetadata(t *testing.T) {
	jdk, err := os.ReadFile(jfrtest.RecordJDK(t, 300))
	if err != nil {
		t.Fatal(err)
	}
	dd := sampleRecording(false).Bytes()
	in := append(append(append(append([]byte(nil), jdk...), dd...), jdk...), dd...)
	n := map[string]int{}
	err = jfr.ParseBytes(in, jfr.Options{}, jfr.Visitor{Sample: func(c *jfr.Chunk, s *jfr.Sample) error {
		n[s.EventType]++
		if _, ok := c.Stack(s.Stack); !ok {
			t.Errorf("%s: no stack %d", s.EventType, s.Stack)
		}
		return nil
	}})
	if err != nil || n["datadog.ExecutionSample"] != 4 || n["jdk.ExecutionSample"] == 0 || n["jdk.ExecutionSample"]%2 != 0 {
		t.Fatalf("%v %v", n, err)
	}
}
