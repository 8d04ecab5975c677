package jfrconv_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
)

// Recordings made by real Java profilers, converted by profsym and by
// Pyroscope's converter (whose output for each ships with the recordings,
// jfrtest.PeerModule): per profile the totals agree exactly and nearly all
// of the value falls on the same stacks (frames compared by method name
// and line, since the two spell class names differently).
//
// Left out, and why (docs/jfr.md):
//   - cpu of wall-clock recordings (async-profiler with wall=, event=wall):
//     Pyroscope also counts a wall-clock sample of a running thread as CPU;
//     profsym, like async-profiler's converter, keeps it a wall sample.
//   - event-with-type-zero (dd-trace-java with both engines): profsym takes
//     the Datadog profiler's CPU and allocation samples, Pyroscope the JDK's.
//   - TLAB profiles of recordings that also have jdk.ObjectAllocationSample
//     (cpool-uint64-constant-index, uint64-ref-id): profsym's alloc is the
//     sampler's, which is compared instead.
//   - nativemem (malloc), lock and live-object profiles: profsym makes none.
func TestPyroscopePeer(t *testing.T) {
	dir := jfrtest.PeerTestdata(t)
	const cpu, wall, alloc = "cpu", "wall", "space"
	const tlabIn, tlabOut, sampled = "memory_alloc_in_new_tlab_objects__count alloc_in_new_tlab_bytes__bytes",
		"memory_alloc_outside_tlab_objects__count alloc_outside_tlab_bytes__bytes", "memory_alloc_sample_objects__count alloc_sample_bytes__bytes"
	const pcpu, pwall = "process_cpu_cpu__nanoseconds", "wall_wall__nanoseconds"
	cases := []struct {
		rec   string
		kind  string
		peer  []string // Pyroscope's profiles, <index>_<metric>, added up
		match float64  // share of the value that must fall on the same stacks
	}{
		{"async-profiler", alloc, []string{"0_" + tlabIn, "1_" + tlabOut}, 1},
		{"cortex-dev-01__kafka-0__cpu__0", cpu, []string{"0_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu__1", cpu, []string{"0_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu__2", cpu, []string{"0_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu__3", cpu, []string{"0_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu_lock0_alloc0__0", cpu, []string{"4_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu_lock0_alloc0__0", alloc, []string{"1_" + tlabIn, "2_" + tlabOut}, 1},
		{"cortex-dev-01__kafka-0__cpu_lock_alloc__0", cpu, []string{"1_" + pcpu}, 1},
		{"cortex-dev-01__kafka-0__cpu_lock_alloc__0", alloc, []string{"0_" + tlabIn}, 1},
		{"cortex-dev-01__kafka-0__cpu_lock_alloc__3", alloc, []string{"0_" + tlabIn}, 1},
		{"cpool-uint64-constant-index", alloc, []string{"3_" + sampled}, 1},
		{"dd-trace-java", cpu, []string{"3_" + pcpu}, 1},
		{"dd-trace-java", alloc, []string{"1_" + tlabIn, "2_" + tlabOut}, 1},
		{"dump2", wall, []string{"3_" + pwall}, 1},
		{"example", cpu, []string{"3_" + pcpu}, 1},
		{"example", alloc, []string{"0_" + tlabIn, "1_" + tlabOut}, 1},
		{"FastSlow_2024_01_16_180855", wall, []string{"2_" + pwall}, 1},
		{"FastSlow_2024_01_16_180855", alloc, []string{"0_" + sampled}, 1},
		{"goland-multichunk", cpu, []string{"4_" + pcpu}, 1},
		{"goland-multichunk", alloc, []string{"1_" + tlabIn, "2_" + tlabOut}, 1},
		{"new_spancontext", cpu, []string{"0_" + pcpu}, 1},
		{"object-allocation-sample", alloc, []string{"1_" + sampled}, 1},
		{"parse_failure_repro1", cpu, []string{"0_" + pcpu}, 1},
		{"uint64-ref-id", alloc, []string{"3_" + sampled}, 1},
		{"wall_tick_sample", wall, []string{"0_" + pwall}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.rec+"/"+tc.kind, func(t *testing.T) {
			pd, _, err := jfrconv.ConvertBytes(gunzipFile(t, filepath.Join(dir, tc.rec+".jfr.gz")), jfrconv.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// Pyroscope's cpu and wall values are samples × 10ms (its
			// tests' sampleRate=100); its alloc profiles hold
			// [objects, bytes].
			scale, col := int64(10_000_000), 0
			if tc.kind == alloc {
				scale, col = 1, 1
			}
			peer := map[string]int64{}
			var peerTotal int64
			for _, p := range tc.peer {
				for k, v := range readCollapsed(t, filepath.Join(dir, tc.rec+"_"+p+"_expected_collapsed.txt.gz"), col) {
					peer[k] += v
					peerTotal += v
				}
			}
			ours := map[string]int64{}
			var total int64
			st, vals := stacks(pd, tc.kind)
			for i, s := range st {
				if len(s) == 0 {
					continue // Pyroscope drops events without a stack; profsym keeps their value
				}
				for _, f := range s {
					// async-profiler 3 names a C++ frame's library as its
					// class: it must stay a native frame all the same.
					if f.typ == "jvm" && strings.Contains(f.name, "::") {
						t.Fatalf("C++ frame %q made a jvm frame", f.name)
					}
				}
				segs := make([]string, 0, len(s))
				for j := len(s) - 1; j >= 0; j-- {
					segs = append(segs, s[j].name+":"+strconv.FormatInt(s[j].line, 10))
				}
				ours[canonStack(strings.Join(segs, ";"))] += vals[i] * scale
				total += vals[i] * scale
			}
			var same int64
			for k, v := range peer {
				same += min(v, ours[k])
			}
			share := float64(same) / float64(max(peerTotal, 1))
			t.Logf("profsym %d, Pyroscope %d; %.2f%% on the same stacks", total/scale, peerTotal/scale, 100*share)
			if total != peerTotal || share < tc.match {
				t.Errorf("profsym %d, Pyroscope %d (x%d); %.4f of the value on the same stacks, want %.4f",
					total, peerTotal, scale, share, tc.match)
			}
		})
	}
}

// readCollapsed reads Pyroscope's collapsed stacks ("f:line;g:line [v w]",
// root first), summing column col by canonical stack.
func readCollapsed(t *testing.T, path string, col int) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(gunzipFile(t, path)))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		l := sc.Text()
		i := strings.LastIndex(l, " [")
		if i < 0 {
			t.Fatalf("%s: line %q", path, l)
		}
		f := strings.Fields(strings.Trim(l[i+2:], "]"))
		v, err := strconv.ParseInt(f[col], 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[canonStack(l[:i])] += v
	}
	return out
}

// canonStack keeps of each frame its method name and line: Pyroscope names
// a frame class + "." + method with the class as recorded (slashes,
// library names for native frames, lambda ids rewritten), profsym the Java
// class with dots or the bare native function. An unknown line is -1 as
// an unsigned 32-bit number in Pyroscope's output, 0 in profsym's.
func canonStack(s string) string {
	segs := strings.Split(s, ";")
	for i, seg := range segs {
		name, line := seg, ""
		if j := strings.LastIndexByte(seg, ':'); j >= 0 {
			name, line = seg[:j], seg[j:]
		}
		if j := strings.LastIndexByte(name, '.'); j >= 0 {
			name = name[j+1:]
		}
		if line == ":4294967295" {
			line = ":0"
		}
		segs[i] = name + line
	}
	return strings.Join(segs, ";")
}

func gunzipFile(t *testing.T, path string) []byte {
	b, err := gunzipPath(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gunzipPath(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var b bytes.Buffer
	if _, err := b.ReadFrom(z); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b.Bytes(), nil
}
