package jfrconv_test

import (
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
)

// FuzzConvert feeds the converter what the receiver feeds it: any bytes.
// It returns a profile or an error without panicking, and a profile's
// sample values never go negative (weights are clamped, sums bounded).
func FuzzConvert(f *testing.F) {
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.ContextAttributes = []string{"http.route"}
	const id = "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b"
	r.Library(jfrtest.Library{Name: "/opt/libx.so", BuildID: id})
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	r.SampleIn(jfrtest.DatadogExecutionSample, 10, 1, 2, 0x1a2b, 0x3c4d, map[string]string{"http.route": "/x"},
		jfrtest.RemoteFrame(id, 0x1a2b), jfrtest.NativeFrame("JNI_Call"), java)
	r.Sample(jfrtest.DatadogMethodSample, 20, 2, 5, java)
	r.Sample(jfrtest.JDKExecutionSample, 30, 2, 1, java)
	r.Alloc(40, 2, "byte[]", 100, 3, java)
	f.Add(r.Bytes())
	if dir, err := jfrtest.PeerTestdataDir(); err == nil {
		for _, name := range []string{"new_spancontext", "wall_tick_sample"} {
			if b, err := gunzipPath(filepath.Join(dir, name+".jfr.gz")); err == nil {
				f.Add(b)
			}
		}
	}
	lim := jfr.Limits{MaxChunkSize: 8 << 20, MaxStringLen: 4096, MaxArrayLen: 512, MaxPoolEntries: 1 << 16, MaxClasses: 1024, MaxCPEvents: 64, MaxChunks: 8}
	f.Fuzz(func(t *testing.T, b []byte) {
		pd, _, err := jfrconv.ConvertBytes(b, jfrconv.Options{Limits: lim, Strings: map[int64]string{1: "span"}})
		if err != nil {
			return
		}
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					for _, s := range p.Samples().All() {
						if s.Values().Len() != 1 || s.Values().At(0) < 0 {
							t.Fatalf("sample values %v", s.Values().AsRaw())
						}
					}
				}
			}
		}
	})
}
