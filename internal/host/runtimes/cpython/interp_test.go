package cpython

import (
	"debug/elf"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// TestInspectInterpreters reads each interpreter of the matrix as Debian
// ships it: statically linked into /usr/bin/python3.X, stripped of
// .symtab, built with LTO and PGO so that GCC split the eval loop.
func TestInspectInterpreters(t *testing.T) {
	for _, v := range Interpreters() {
		t.Run(v.Name, func(t *testing.T) {
			path, mapped := v.Code(v.Root(t))
			f, err := elfx.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c, ok := findCandidate(&normalize.Process{Mappings: []normalize.Mapping{{Path: mapped, File: &normalize.FileInfo{}}}})
			if !ok {
				t.Fatalf("%s not taken for an interpreter", mapped)
			}
			fi := inspect(f, c)
			if fi.err != nil {
				t.Fatal(fi.err)
			}
			t.Logf("3.%d: eval [%#x,%#x) cold [%#x,%#x) (%s)", fi.minor, fi.eval[0], fi.eval[1], fi.cold[0], fi.cold[1], fi.coldFrom)
			if fi.minor != v.Minor {
				t.Errorf("minor %d, want %d", fi.minor, v.Minor)
			}
			if v.Lib == "" && (fi.cold[1] <= fi.cold[0] || fi.cold[1]-fi.cold[0] > maxEvalBytes) {
				t.Errorf("no cold part found (%s); Debian's builds all have one", fi.coldFrom)
			}
			if fi.cold[0] < fi.eval[1] && fi.cold[1] > fi.eval[0] {
				t.Errorf("cold part overlaps the eval function")
			}
			if fi.minor == 6 {
				// A stripped 3.6 has no interp_head symbol: the load in
				// PyInterpreterState_Head must find the same variable.
				syms := map[string]elf.Symbol{}
				ds, _ := f.DynamicSymbols()
				for _, s := range ds {
					if s.Name == symInterpHeadFunc {
						syms[s.Name] = s
					}
				}
				if head, err := interpHead(f, syms); err != nil || head != fi.runtime {
					t.Errorf("interp_head from %s: %#x, %v; the symbol says %#x", symInterpHeadFunc, head, err, fi.runtime)
				}
			}
		})
	}
}

func TestCandidateNames(t *testing.T) {
	for name, want := range map[string]int{
		"/usr/bin/python3.11": 11, "/usr/lib/x86_64-linux-gnu/libpython3.9.so.1.0": 9,
		"/opt/py/bin/python3": 0, "/usr/bin/python3.13t": 13, "/usr/bin/perl": -1, "/usr/lib/libpython2.7.so.1.0": -1,
		"/tmp/python3.11-evil.so": -1, "/opt/py/lib/libpython3.7m.so.1.0": 7,
	} {
		c, ok := findCandidate(&normalize.Process{Mappings: []normalize.Mapping{{Path: name, File: &normalize.FileInfo{}}}})
		switch {
		case want < 0 && ok, want >= 0 && !ok, ok && c.minor != want:
			t.Errorf("%s: candidate %v minor %d, want %d", name, ok, c.minor, want)
		}
	}
	// The library wins over the executable that links it.
	c, _ := findCandidate(&normalize.Process{Mappings: []normalize.Mapping{
		{Path: "/usr/bin/python3.11", File: &normalize.FileInfo{}},
		{Path: "/usr/lib/libpython3.11.so.1.0", File: &normalize.FileInfo{}}}})
	if !c.lib {
		t.Errorf("took %s, want the library", c.m.Path)
	}
}
