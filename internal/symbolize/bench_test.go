package symbolize

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// benchObject is one binary of the side-by-side benchmark.
type benchObject struct {
	name  string
	path  string
	addrs []uint64
}

// goCompile builds Go's own compiler with DWARF (release toolchains ship it
// without), cached next to the other fixtures.
func goCompile(b testing.TB) string {
	gobin := testfixture.NeedTool(b, "go")
	ver, _ := exec.Command(gobin, "version").Output()
	out := filepath.Join(testfixture.CacheDir(), fmt.Sprintf("compile-%x", bytes.TrimSpace(ver)))
	out = filepath.Join(filepath.Dir(out), filepath.Base(out)[:min(len(filepath.Base(out)), 60)])
	if _, err := os.Stat(out); err == nil {
		return out
	}
	os.MkdirAll(filepath.Dir(out), 0o755)
	tmp := out + ".tmp"
	cmd := exec.Command(gobin, "build", "-o", tmp, "cmd/compile")
	cmd.Env = append(os.Environ(), "GOFLAGS=", "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build cmd/compile: %v\n%s", err, o)
	}
	if err := os.Rename(tmp, out); err != nil {
		b.Fatal(err)
	}
	return out
}

// spread returns n addresses spread evenly over .text.
func spread(b *testing.B, path string, n int) []uint64 {
	f, err := elf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	text := f.Section(".text")
	step := text.Size/uint64(n) | 1
	out := make([]uint64, 0, n)
	for a := text.Addr; a < text.Addr+text.Size && len(out) < n; a += step {
		out = append(out, a)
	}
	return out
}

func benchObjects(b *testing.B) []benchObject { return benchObjectsN(b, 10000) }

// benchObjectsN is Go's compile and libc (when present) with n addresses
// each.
func benchObjectsN(b *testing.B, n int) []benchObject {
	var objs []benchObject
	c := goCompile(b)
	objs = append(objs, benchObject{"go-compile", c, spread(b, c, n)})
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err == nil {
		objs = append(objs, benchObject{"libc", libc, spread(b, libc, n)})
	}
	return objs
}

// runTool runs one symbolizer process over addrs on stdin and returns its
// wall time, CPU time (user + system) and peak RSS.
func runTool(b *testing.B, argv []string, addrs []uint64) (wall, cpu time.Duration, rss int64) {
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "0x%x\n", a)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = &in
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%v: %v", argv, err)
	}
	wall = time.Since(start)
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if bytes.Count(out.Bytes(), []byte("\n\n")) < len(addrs) {
		b.Fatalf("%v answered %d of %d addresses", argv, bytes.Count(out.Bytes(), []byte("\n\n")), len(addrs))
	}
	cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return wall, cpu, ru.Maxrss * 1024
}

func buildCLI(b *testing.B) string {
	out := filepath.Join(b.TempDir(), "profsym")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/profsym")
	cmd.Dir = testfixture.Root(b)
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building profsym: %v\n%s", err, o)
	}
	return out
}

// BenchmarkSymbolizeCold runs profsym symbolize and llvm-symbolizer-19 as
// separate processes over the same 400 and 10,000 addresses, alternating,
// and reports the wall time, CPU time and peak RSS of each and their
// ratios (targets: time-ratio <= 0.5, cpu-ratio <= 1).
func BenchmarkSymbolizeCold(b *testing.B) {
	llvm := testfixture.NeedTool(b, "llvm-symbolizer-19")
	cli := buildCLI(b)
	for _, n := range []int{400, 10000} {
		for _, o := range benchObjectsN(b, n) {
			b.Run(fmt.Sprintf("%s-%d", o.name, n), func(b *testing.B) {
				var pw, lw, pc, lc time.Duration
				var pr, lr int64
				// One untimed run of each first: the files in the page
				// cache for both, not for whichever tool runs second.
				runTool(b, []string{cli, "symbolize", "--inlines", "--obj=" + o.path}, o.addrs)
				runTool(b, []string{llvm, "--inlines", "--obj=" + o.path}, o.addrs)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					w, c, r := runTool(b, []string{cli, "symbolize", "--inlines", "--obj=" + o.path}, o.addrs)
					pw, pc, pr = pw+w, pc+c, max(pr, r)
					w, c, r = runTool(b, []string{llvm, "--inlines", "--obj=" + o.path}, o.addrs)
					lw, lc, lr = lw+w, lc+c, max(lr, r)
				}
				b.ReportMetric(float64(pw.Milliseconds())/float64(b.N), "profsym-ms")
				b.ReportMetric(float64(lw.Milliseconds())/float64(b.N), "llvm-ms")
				b.ReportMetric(float64(pw)/float64(lw), "time-ratio")
				b.ReportMetric(float64(pc.Milliseconds())/float64(b.N), "profsym-cpu-ms")
				b.ReportMetric(float64(lc.Milliseconds())/float64(b.N), "llvm-cpu-ms")
				b.ReportMetric(float64(pc)/float64(lc), "cpu-ratio")
				b.ReportMetric(float64(pr)/(1<<20), "profsym-rss-MB")
				b.ReportMetric(float64(lr)/(1<<20), "llvm-rss-MB")
				b.ReportMetric(float64(pr)/float64(lr), "rss-ratio")
			})
		}
	}
}

// BenchmarkSymbolizeWarm measures a resident resolver with inlines: every
// object already opened and every unit touched once.
func BenchmarkSymbolizeWarm(b *testing.B) {
	for _, o := range benchObjects(b) {
		b.Run(o.name, func(b *testing.B) {
			r := New(DefaultOptions())
			defer r.Close()
			bin, debug := target{path: o.path}.files(b)
			h, err := r.Open(context.Background(), bin, debug)
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			var dst []Frame
			for _, a := range o.addrs {
				dst, _ = h.Lookup(a, dst[:0])
			}
			b.ReportAllocs()
			b.ResetTimer()
			n := 0
			for i := 0; i < b.N; i++ {
				for _, a := range o.addrs {
					dst, _ = h.Lookup(a, dst[:0])
					n++
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/addr")
		})
	}
}

// BenchmarkIndexCold compares, for Go's compile and libc (with libc6-dbg),
// what a gateway replica pays to answer its first addresses of a binary:
// opening its files and parsing the DWARF units they fall in, against
// opening the binary's symbol index (compiled once, by another replica).
// Reported: both times and their ratio (target: index-ratio <= 0.1), the
// full parse a compile costs, and memory: the parsed object's cache charge
// against the index's heap (it is read with pread, nothing is mapped;
// target: mem-ratio <= 0.2).
func BenchmarkIndexCold(b *testing.B) {
	for _, n := range []int{1, 400} {
		for _, o := range benchObjectsN(b, n) {
			b.Run(fmt.Sprintf("%s-%d", o.name, n), func(b *testing.B) {
				bin, debug := target{path: o.path}.files(b)
				r := New(DefaultOptions())
				p, id, st, err := writeIndex(b, r, bin, debug)
				r.Close()
				if err != nil {
					b.Fatal(err)
				}
				var files, index, full time.Duration
				var objBytes, resident int64
				for i := 0; i < b.N; i++ {
					// A resolver per round: nothing parsed is reused.
					start := time.Now()
					r := New(DefaultOptions())
					h, err := r.Open(context.Background(), bin, debug)
					if err != nil {
						b.Fatal(err)
					}
					for _, a := range o.addrs {
						h.Lookup(a, nil)
					}
					files += time.Since(start)
					objBytes = h.obj.sizeBytes()
					start = time.Now()
					if _, err := h.WriteIndex(context.Background(), io.Discard); err != nil {
						b.Fatal(err)
					}
					full += time.Since(start)
					h.Close()
					r.Close()

					start = time.Now()
					r = New(DefaultOptions())
					h, err = r.OpenIndex(context.Background(), p, id)
					if err != nil {
						b.Fatal(err)
					}
					for _, a := range o.addrs {
						h.Lookup(a, nil)
					}
					index += time.Since(start)
					resident = h.obj.idx.HeapBytes()
					h.Close()
					r.Close()
				}
				nb := float64(b.N)
				b.ReportMetric(float64(files.Microseconds())/nb/1000, "files-ms")
				b.ReportMetric(float64(index.Microseconds())/nb/1000, "index-ms")
				b.ReportMetric(float64(index)/float64(files), "index-ratio")
				b.ReportMetric(float64(full.Microseconds())/nb/1000, "compile-ms")
				b.ReportMetric(float64(objBytes)/(1<<20), "object-MB")
				// An index is read with pread: no mapping, so its memory is
				// its heap (page table and names read), against the parsed
				// object's charge. index-MB is the file, in the page cache.
				b.ReportMetric(float64(st.Bytes)/(1<<20), "index-MB")
				b.ReportMetric(float64(resident)/(1<<20), "index-heap-MB")
				b.ReportMetric(float64(resident)/float64(objBytes), "mem-ratio")
			})
		}
	}
}
