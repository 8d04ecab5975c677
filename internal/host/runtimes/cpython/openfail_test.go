package cpython

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// entries is the walker's map as the host writes it, for a test that
// needs no walker.
type entries map[any]any

func (e entries) Put(k, v any) error { e[k] = v; return nil }
func (e entries) Delete(k any) error { delete(e, k); return nil }

// A file the process's view of the file system cannot open (it is
// exiting, or the host is busy) is the process's failure, not the
// file's: it is neither kept for the file nor a refusal, and once the
// path opens the file is read and judged on what it is.
func TestOpenFailureIsNotTheFiles(t *testing.T) {
	root := t.TempDir()
	now := time.Unix(1000, 0)
	walker := entries{}
	r := New(Options{ProcRoot: root, Procs: walker, Now: func() time.Time { return now }})
	f, err := elfx.Open("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	loads := f.Loads()
	f.Close()
	id := normalize.FileID{Dev: 1, Ino: 2}
	p := &normalize.Process{PID: 4242, Mappings: []normalize.Mapping{{
		Path: "/usr/bin/python3.11", Start: 0x400000, End: 0x500000,
		File: &normalize.FileInfo{ID: id, Loads: loads},
	}}}

	_, found, err := r.Attach(p)
	if !found || err != nil {
		t.Fatalf("first attach, file not openable: found %v, err %v; want a retry, not a refusal", found, err)
	}
	if _, ok := r.files.Get(id); ok {
		t.Fatal("the open failure was kept for the file")
	}
	if len(walker) != 0 {
		t.Fatalf("walker entries written: %v", walker)
	}

	// Now the process's path opens, to a file that is no interpreter.
	dst := filepath.Join(root, "4242", "root", "usr", "bin", "python3.11")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/true", dst); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	_, _, err = r.Attach(p)
	if !errors.Is(err, errUnsupported) || strings.Contains(err.Error(), "opening") {
		t.Fatalf("second attach: %v; want the file's own refusal (no eval loop)", err)
	}
	if _, ok := r.files.Get(id); !ok {
		t.Error("the file's inspection was not kept")
	}
}
