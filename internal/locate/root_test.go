package locate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

func TestInRoot(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/lib/libc.so.6"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "outside"), []byte("x"), 0o644)
	os.Symlink("/usr/lib", filepath.Join(root, "lib"))            // absolute: inside root
	os.Symlink("../../../outside", filepath.Join(root, "usr/up")) // climbs: clamped at root
	os.Symlink("loop", filepath.Join(root, "loop"))
	for in, want := range map[string]string{
		"/usr/lib/libc.so.6":          "usr/lib/libc.so.6",
		"/lib/libc.so.6":              "usr/lib/libc.so.6",
		"/../outside":                 "outside", // inside root, where it does not exist
		"/../../x/../../y":            "y",
		"/usr/up":                     "outside",
		"/usr/lib/../lib/./libc.so.6": "usr/lib/libc.so.6",
	} {
		got, err := InRoot(root, in)
		if err != nil || got != filepath.Join(root, want) {
			t.Errorf("InRoot(%q) = %q, %v; want %q", in, got, err, filepath.Join(root, want))
		}
		if !strings.HasPrefix(got, root+"/") {
			t.Errorf("InRoot(%q) = %q escapes %s", in, got, root)
		}
	}
	for _, in := range []string{"relative/x", "/loop", "/a\x00b"} {
		if _, err := InRoot(root, in); !errors.Is(err, frame.ErrInvalidPath) {
			t.Errorf("InRoot(%q) = %v, want invalid_path", in, err)
		}
	}
	if got, _ := InRoot("", "/../x"); got != "/x" {
		t.Errorf("no root: %q", got)
	}
}

// Whatever path a frame carries, the result stays inside the root.
func FuzzInRoot(f *testing.F) {
	root := f.TempDir()
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.Symlink("/", filepath.Join(root, "a/top"))
	os.Symlink("../../..", filepath.Join(root, "a/b/up"))
	for _, s := range []string{"/a/b/c", "/../x", "/a/top/../../etc/passwd", "/a/b/up/up/x", "//a/./b/../../..", "/a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := InRoot(root, p)
		if err != nil {
			if !errors.Is(err, frame.ErrInvalidPath) {
				t.Fatalf("InRoot(%q): %v", p, err)
			}
			return
		}
		if got != root && !strings.HasPrefix(got, root+"/") {
			t.Fatalf("InRoot(%q) = %q escapes %s", p, got, root)
		}
	})
}
