//go:build linux

package unwind

import (
	"go/build"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/profsym/profsym/internal/host/normalize"
)

// TestCostWorkload runs one fixed workload, for counting its instructions
// with callgrind: a figure that does not move with the machine's load
// (CPU-seconds do, by 20-30% on the shared development machine). Skipped
// unless PROFSYM_COST_WORKLOAD names the workload:
//
//	go test -c -o /tmp/unwind.test ./internal/host/unwind
//	for w in none libc go-compile libLLVM snapshot; do
//	  PROFSYM_COST_WORKLOAD=$w GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind \
//	    --callgrind-out-file=/dev/null /tmp/unwind.test -test.run TestCostWorkload 2>&1 | grep Collected
//	done
//
// A workload's cost is its "Collected" count minus that of none (the test
// binary's start and end); the GC's work for what it allocates is counted.
// asyncpreemptoff: callgrind does not survive the Go runtime's preemption
// signals (nor its stack switches: --toggle-collect miscounts). Workloads:
//
//	none                        nothing
//	libc, go-compile, libLLVM   one table built as a builder does (open, build,
//	                            encode, copy into shared memory)
//	snapshot                    200 snapshots (/proc/PID) of this process
func TestCostWorkload(t *testing.T) {
	w := os.Getenv("PROFSYM_COST_WORKLOAD")
	if w == "" {
		t.Skip("PROFSYM_COST_WORKLOAD not set")
	}
	switch w {
	case "none":
	case "snapshot":
		// This process itself: spawning one under callgrind crashes it.
		norm := normalize.New(normalize.Options{})
		pid := os.Getpid()
		if _, err := norm.Refresh(pid); err != nil { // files identified once
			t.Fatal(err)
		}
		costRun(func() {
			for range 200 {
				if _, err := norm.Refresh(pid); err != nil {
					t.Fatal(err)
				}
			}
		})
	default:
		paths := map[string]string{
			"libc":       "/lib/x86_64-linux-gnu/libc.so.6",
			"go-compile": filepath.Join(build.ToolDir, "compile"),
			"libLLVM":    "/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1",
		}
		path, ok := paths[w]
		if !ok {
			t.Fatalf("unknown workload %q", w)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		f := &file{id: normalize.FileID{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim.Nano()}, path: path}
		b := &testing.B{}
		var rows int
		costRun(func() { rows = benchBuild(b, f, path) })
		t.Logf("%s: %d rows", w, rows)
	}
}

func costRun(fn func()) { fn() }
