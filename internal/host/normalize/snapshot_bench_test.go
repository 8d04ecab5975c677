//go:build linux

package normalize

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkSnapshot measures a snapshot of a new process whose files are
// all known (the common case of a fleet's short-lived processes: a shell
// running `sleep`), whole and by the /proc file it reads, in process CPU
// (user and system: reading /proc costs mostly the kernel's formatting)
// per snapshot:
//
//	go test -run '^$' -bench Snapshot -benchtime 3000x ./internal/host/normalize
func BenchmarkSnapshot(b *testing.B) {
	sleep := testfixture.NeedTool(b, "sleep")
	cmd := exec.Command(sleep, "600")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if exe, _ := os.Readlink(filepath.Join(dir, "exe")); exe == sleep || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	n := New(Options{})
	if _, err := n.Refresh(pid); err != nil { // the files, known
		b.Fatal(err)
	}
	var maps []addrmap.Mapping
	if f, err := os.Open(filepath.Join(dir, "maps")); err == nil {
		addrmap.QueryExec(f, func(m addrmap.Mapping) error {
			if m.IsFile() {
				maps = append(maps, m)
			}
			return nil
		})
		f.Close()
	}
	b.Logf("%d file mappings", len(maps))
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"refresh", func() { n.read(pid) }},
		{"comm", func() { os.ReadFile(filepath.Join(dir, "comm")) }},
		{"exe", func() { os.Readlink(filepath.Join(dir, "exe")) }},
		{"cgroup", func() { readCgroupFile(filepath.Join(dir, "cgroup")) }},
		{"status", func() { readVPID(filepath.Join(dir, "status")) }},
		{"ns-pid", func() { os.Readlink(filepath.Join(dir, "ns", "pid")) }},
		{"maps-query", func() {
			f, err := os.Open(filepath.Join(dir, "maps"))
			if err != nil {
				b.Fatal(err)
			}
			addrmap.QueryExec(f, func(addrmap.Mapping) error { return nil })
			f.Close()
		}},
		{"files", func() {
			for _, m := range maps {
				n.file(dir, m)
			}
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cost := testfixture.Measure(func() {
				for range b.N {
					c.fn()
				}
			})
			b.ReportMetric(float64(cost.CPU.Microseconds())/float64(b.N), "cpu_us/op")
		})
	}
}
