//go:build linux

package unwind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkBuildFile measures what the sampler's builders pay for one table,
// on the path they take (open and check the file, build, encode to 8-byte
// rows, copy them into shared memory as into the rows map), in figures that
// do not depend on the machine's load:
//
//	go test -run '^$' -bench BuildFile -benchtime 5x ./internal/host/unwind
//
//	cpu_ms/op       process CPU per build (GC included)
//	alloc_MB/op     Go heap allocated per build
//	heap_peak_MB    high-water of the Go heap above its level before the build
//	rss_peak_MB     high-water of the resident set above its level before
//	                (the file's mapped pages the build touches count too)
//	rows            rows loaded
//
// Files: libc, Go's compile (.gopclntab), the same without section headers
// (the pclntab must be found without them) and LLVM's shared library (the
// largest .eh_frame at hand, 6 MB).
func BenchmarkBuildFile(b *testing.B) {
	compile := goTool(b, "compile")
	stripped := filepath.Join(b.TempDir(), "compile-nosections")
	objcopy := testfixture.NeedTool(b, "llvm-objcopy-19")
	if out, err := exec.Command(objcopy, "--strip-sections", compile, stripped).CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", objcopy, err, out)
	}
	for _, c := range []struct{ name, path string }{
		{"libc", "/lib/x86_64-linux-gnu/libc.so.6"},
		{"go-compile", compile},
		{"go-compile-nosections", stripped},
		{"libLLVM-19", "/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1"},
	} {
		b.Run(c.name, func(b *testing.B) {
			var st syscall.Stat_t
			if err := syscall.Stat(c.path, &st); err != nil {
				testfixture.SkipOrFail(b, "%s: %v", c.path, err)
			}
			f := &file{id: normalize.FileID{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano()}, path: c.path}
			var total testfixture.Cost
			rows := 0
			b.ReportAllocs()
			for range b.N {
				total = total.Add(testfixture.MeasureHeap(func() { rows = benchBuild(b, f, c.path) }))
			}
			n := float64(b.N)
			b.ReportMetric(total.CPU.Seconds()*1e3/n, "cpu_ms/op")
			b.ReportMetric(float64(total.Alloc)/n/1e6, "alloc_MB/op")
			b.ReportMetric(float64(total.HeapPeak)/1e6, "heap_peak_MB")
			b.ReportMetric(float64(total.RSSPeak)/1e6, "rss_peak_MB")
			b.ReportMetric(float64(rows), "rows")
		})
	}
}

// benchBuild builds f's table as a builder does and copies its rows into
// a shared anonymous mapping, as writeRows does into the rows map.
func benchBuild(b *testing.B, f *file, path string) int {
	enc, err := buildFile(f, []string{path}, MaxRowsPerTable)
	if err != nil {
		b.Fatal(err)
	}
	defer enc.rows.release()
	n := enc.rows.len()
	mem, err := unix.Mmap(-1, 0, max(n*RowBytes, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	enc.rows.writeTo(mem)
	if err := unix.Munmap(mem); err != nil {
		b.Fatal(err)
	}
	return n
}

func goTool(t testing.TB, name string) string {
	out, err := exec.Command(testfixture.NeedTool(t, "go"), "env", "GOTOOLDIR").Output()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}
