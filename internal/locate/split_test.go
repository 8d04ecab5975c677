package locate

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDWOPaths: the places a skeleton's DW_AT_dwo_name and DW_AT_comp_dir
// lead to stay inside the object's folder, a debug directory or a symbol
// directory, however those names try to leave them.
func TestDWOPaths(t *testing.T) {
	files := []string{"/srv/app/bin/server", ""}
	debug := []string{"/usr/lib/debug"}
	syms := []string{"/srv/symbols"}
	for _, c := range []struct {
		name, compDir string
		want          []string
	}{
		{"main.dwo", "/srv/app/bin", []string{"/srv/app/bin/main.dwo", "/usr/lib/debug/srv/app/bin/main.dwo"}},
		{"obj/main.dwo", "/build/x", []string{"/srv/app/bin/obj/main.dwo", "/srv/app/bin/main.dwo", "/usr/lib/debug/build/x/obj/main.dwo"}},
		{"/srv/symbols/a/main.dwo", "", []string{"/srv/symbols/a/main.dwo", "/srv/app/bin/main.dwo", "/usr/lib/debug/srv/symbols/a/main.dwo"}},
		// Escapes: what is left is inside the binary's folder or a debug
		// directory.
		{"../../../etc/shadow.dwo", "/srv/app/bin", []string{"/srv/app/bin/shadow.dwo", "/usr/lib/debug/etc/shadow.dwo"}},
		{"shadow.dwo", "/etc", []string{"/srv/app/bin/shadow.dwo", "/usr/lib/debug/etc/shadow.dwo"}},
		{"/etc/shadow", "", []string{"/srv/app/bin/shadow", "/usr/lib/debug/etc/shadow"}},
		{"x.dwo", "/usr/lib/debug/../../../etc", []string{"/srv/app/bin/x.dwo", "/usr/lib/debug/etc/x.dwo"}},
		{"../../../../../../etc/passwd.dwo", "", []string{"/srv/app/bin/passwd.dwo"}},
		{"..", "/srv/app/bin", nil},
		{"a\x00b.dwo", "/srv/app/bin", nil},
		{"", "/srv/app/bin", nil},
	} {
		got := dwoPaths(files, debug, syms, c.name, c.compDir)
		if !slices.Equal(got, c.want) {
			t.Errorf("%q in %q: got %q, want %q", c.name, c.compDir, got, c.want)
		}
	}
}

// TestLocateSplit finds a package beside the binary, a .dwo beside it by
// name, and a .dwo in a symbol directory by its base name.
func TestLocateSplit(t *testing.T) {
	dir, syms := t.TempDir(), t.TempDir()
	bin := filepath.Join(dir, "prog")
	for _, p := range []string{bin, bin + ".dwp", filepath.Join(dir, "a.dwo"), filepath.Join(syms, "deep", "b.dwo")} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("x"), 0o644)
	}
	c := New(Options{Sources: []Source{DebugDirs{Dirs: []string{t.TempDir()}}, NewSymbolDirs([]string{syms}, 0, 0)}})
	ctx := context.Background()
	for _, q := range []struct{ name, comp, want string }{
		{"", "", bin + ".dwp"},
		{"a.dwo", "/gone/build", filepath.Join(dir, "a.dwo")},
		{"obj/b.dwo", "/gone/build", filepath.Join(syms, "deep", "b.dwo")},
	} {
		got, err := c.LocateSplit(ctx, []string{bin}, q.name, q.comp)
		if err != nil || got != q.want {
			t.Errorf("%q: %q, %v; want %q", q.name, got, err, q.want)
		}
	}
	if _, err := c.LocateSplit(ctx, []string{bin}, "missing.dwo", "/gone"); err == nil {
		t.Errorf("a missing .dwo was found")
	}
}
