package hotspot

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// TestDumpTables writes the tables of a running JVM (HSDUMP_PID) in the
// testdata/jdkN.tables format, keeping the types profsym reads, to
// HSDUMP_OUT: how those files are made when a JDK is added.
func TestDumpTables(t *testing.T) {
	pid, err := strconv.Atoi(os.Getenv("HSDUMP_PID"))
	if err != nil {
		t.Skip("HSDUMP_PID is not set: nothing to dump")
	}
	p, err := normalize.New(normalize.Options{}).Refresh(pid)
	if err != nil {
		t.Fatal(err)
	}
	m := libjvm(p)
	if m == nil {
		t.Fatalf("pid %d maps no libjvm.so", pid)
	}
	bias, _ := loadBias(m)
	mem, err := runtimes.OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	r := &Runtime{procRoot: "/proc"}
	syms, err := r.symbols(pid, m)
	if err != nil {
		t.Fatal(err)
	}
	want := wantTypes
	if os.Getenv("HSDUMP_ALL") != "" {
		want = nil
	}
	tb, err := readTables(mem, syms, bias, want)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for k, f := range tb.fields {
		if f.static {
			lines = append(lines, fmt.Sprintf("F %s static @%#x", k, f.value-bias))
		} else {
			w := ""
			if f.width != 0 {
				w = fmt.Sprintf(" %d", f.width)
			}
			lines = append(lines, fmt.Sprintf("F %s %d%s", k, f.value, w))
		}
	}
	for k, v := range tb.types {
		lines = append(lines, fmt.Sprintf("T %s %d", k, v))
	}
	for k, v := range tb.ints {
		lines = append(lines, fmt.Sprintf("I %s %d", k, v))
	}
	slices.Sort(lines)
	out := strings.Join(lines, "\n") + "\n"
	if o := os.Getenv("HSDUMP_OUT"); o != "" {
		if err := os.WriteFile(o, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	fmt.Print(out)
}
