package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/testfixture"
)

// bigJFR concatenates copies of a real JDK 17 recording (10 s of Hot,
// settings=profile) into a file of at least size bytes: a multi-chunk
// recording like a long-running service's, every chunk the JDK's own.
func bigJFR(b *testing.B, size int64) string {
	rec := jfrtest.RecordJDK(b, 10000)
	out := filepath.Join(testfixture.CacheDir(), fmt.Sprintf("jfr-big-%d-%s.jfr", size>>20, filepath.Base(filepath.Dir(rec))))
	if st, err := os.Stat(out); err == nil && st.Size() >= size {
		return out
	}
	one, err := os.ReadFile(rec)
	if err != nil {
		b.Fatal(err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for n < size {
		w, err := f.Write(one)
		if err != nil {
			b.Fatal(err)
		}
		n += int64(w)
	}
	f.Close()
	if err := os.Rename(tmp, out); err != nil {
		b.Fatal(err)
	}
	return out
}

type measured struct {
	wall   time.Duration
	maxRSS int64 // bytes
}

func runMeasured(b *testing.B, stdout io.Writer, name string, args ...string) measured {
	cmd := exec.Command(name, args...)
	cmd.Stdout = stdout
	cmd.Stderr = io.Discard
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %v: %v", name, args, err)
	}
	m := measured{wall: time.Since(start)}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		m.maxRSS = ru.Maxrss << 10
	}
	return m
}

// BenchmarkConvertJFR100MB converts a 100 MB multi-chunk JDK recording with
// `profsym convert --to pprof` and reads it with the JDK's `jfr print
// --json`, side by side in one run: wall time and peak RSS of each, and
// the speed ratio (target: at least 3x). profsym holds one chunk at a time,
// so its memory does not grow with the file.
func BenchmarkConvertJFR100MB(b *testing.B) {
	big := bigJFR(b, 100<<20)
	st, _ := os.Stat(big)
	dir := b.TempDir()
	bin := filepath.Join(dir, "profsym")
	testfixture.Run(b, testfixture.NeedTool(b, "go"), "build", "-o", bin, filepath.Join(testfixture.Root(b), "cmd", "profsym"))
	jfrTool := jfrtest.JFRTool(b)
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	b.ResetTimer()
	var ours, peer measured
	for i := 0; i < b.N; i++ {
		o := runMeasured(b, devnull, bin, "convert", big, "--to", "pprof", "-o", filepath.Join(dir, "out.pb.gz"))
		p := runMeasured(b, devnull, jfrTool, "print", "--json", big)
		ours.wall += o.wall
		peer.wall += p.wall
		ours.maxRSS = max(ours.maxRSS, o.maxRSS)
		peer.maxRSS = max(peer.maxRSS, p.maxRSS)
	}
	n := float64(b.N)
	b.ReportMetric(float64(st.Size())/1e6, "MB")
	b.ReportMetric(ours.wall.Seconds()/n, "profsym-s")
	b.ReportMetric(peer.wall.Seconds()/n, "jfrprint-s")
	b.ReportMetric(peer.wall.Seconds()/ours.wall.Seconds(), "speedup")
	b.ReportMetric(float64(ours.maxRSS)/(1<<20), "profsym-maxrss-MiB")
	b.ReportMetric(float64(peer.maxRSS)/(1<<20), "jfrprint-maxrss-MiB")
}
