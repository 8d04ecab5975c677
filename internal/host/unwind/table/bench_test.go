package table_test

import (
	"os/exec"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/unwind/table"
	"github.com/profsym/profsym/internal/testfixture"
)

// bpfRowBytes is the size the sampler's BPF maps give one row.
const bpfRowBytes = 8

// BenchmarkBuild measures building the table of real files: libc, Go's
// compile tool (.gopclntab) and LLVM's shared library (a large C++ object),
// and, side by side, llvm-dwarfdump-19 decoding the same CFI into rows
// (its text output discarded): a reference, not the same work.
//
//	go test -run '^$' -bench BenchmarkBuild -benchmem ./internal/host/unwind/table/
func BenchmarkBuild(b *testing.B) {
	for _, c := range []struct {
		name, path, peerFlag string
	}{
		{"libc", libc, "--eh-frame"},
		{"go-compile", goTool(b, "compile"), ""},
		{"libLLVM-19", "/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1", "--eh-frame"},
	} {
		needFile(b, c.path)
		f, err := elfx.Open(c.path)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			var tab *table.Table
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				tab, err = table.Build(f, table.Options{})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			mb := float64(tab.Stats.SourceBytes) / (1 << 20)
			perBuild := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(len(tab.Rows)), "rows")
			b.ReportMetric(float64(len(tab.Rows))/mb, "rows/MB")
			b.ReportMetric(perBuild/float64(len(tab.Rows)), "ns/row")
			b.ReportMetric(perBuild/mb/1e6, "ms/MB")
			b.ReportMetric(float64(len(tab.Rows)*bpfRowBytes)/mb, "bpf-B/MB")
			b.ReportMetric(float64(tab.SizeBytes())/mb, "go-B/MB")
			b.Logf("%s: %s, %.2f MB of unwind info, %d rows, stats %+v", c.name, tab.Source, mb, len(tab.Rows), tab.Stats)
		})
		if c.peerFlag != "" {
			b.Run(c.name+"/llvm-dwarfdump-19", func(b *testing.B) {
				tool := testfixture.NeedTool(b, "llvm-dwarfdump-19")
				start := time.Now()
				for i := 0; i < b.N; i++ {
					cmd := exec.Command(tool, c.peerFlag, c.path)
					if err := cmd.Run(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/1e6, "ms/op")
			})
		}
		f.Close()
	}
}
