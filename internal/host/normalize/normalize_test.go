package normalize

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"syscall"
	"testing"
)

//go:noinline
func marker() int { return 42 }

// The test binary normalizes one of its own functions to the ELF address
// its symbol table gives.
func TestSelf(t *testing.T) {
	n := New(Options{})
	p, err := n.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	pc := uint64(reflect.ValueOf(marker).Pointer())
	m, vaddr, ok := p.Normalize(pc)
	if !ok {
		t.Fatalf("%#x not normalized (mapping %+v)", pc, m)
	}
	exe, _ := os.Executable()
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// go test links without a symbol table; a non-PIE executable runs at
	// its link addresses, so there the ELF address is the pc itself.
	name := runtime.FuncForPC(uintptr(pc)).Name()
	want := uint64(0)
	if f.Type == elf.ET_EXEC {
		want = pc
	}
	syms, _ := f.Symbols()
	for _, s := range syms {
		if s.Name == name {
			want = s.Value
		}
	}
	if want == 0 || vaddr != want {
		t.Fatalf("%s: vaddr %#x, symbol %#x", name, vaddr, want)
	}
	if m.File == nil || m.File.HTLHash == "" || len(m.File.Loads) == 0 {
		t.Fatalf("file identity missing: %+v", m.File)
	}
	if m.File.GoBuildID == "" {
		t.Error("a Go test binary should carry a Go build id")
	}
	// Cached: the same snapshot comes back without reading /proc again.
	if q, _ := n.Process(os.Getpid()); q != p || n.Tracked() != 1 {
		t.Error("snapshot not cached")
	}
	n.Forget(os.Getpid())
	if n.Cached(os.Getpid()) != nil {
		t.Error("Forget kept the snapshot")
	}
}

func TestGone(t *testing.T) {
	n := New(Options{ProcRoot: t.TempDir()})
	if _, err := n.Process(12345); err == nil {
		t.Fatal("a process without /proc entry must fail")
	}
}

// A mapped file that cannot be read at all (here a directory in the
// file's place; in life a process gone between the stat and the open) is
// not remembered: its failure would be the file's answer for every
// process that maps it. A file read and found not to be ELF is.
func TestUnreadableFileNotCached(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "4242")
	for _, d := range []string{dir, filepath.Join(dir, "root", "bin", "gone")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "root", "bin", "script"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	maps := "1000-2000 r-xp 00000000 08:01 11 /bin/gone\n3000-4000 r-xp 00000000 08:01 12 /bin/script\n"
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
	n := New(Options{ProcRoot: root})
	p, err := n.Process(4242)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Mappings) != 2 || p.Mappings[0].File.Err == nil || p.Mappings[1].File.Err == nil || p.Mappings[1].File.HTLHash == "" {
		t.Fatalf("mappings %+v", p.Mappings)
	}
	if e := n.files.Stats().Entries; e != 1 {
		t.Errorf("%d files cached, want 1 (the script, read: not ELF)", e)
	}
}

// An exiting process still lists its mappings while its files can no
// longer be opened through it: a snapshot taken then keeps what the one
// before knew of a file mapped at the same place from the same inode.
func TestExitingProcessKeepsItsFiles(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "4242")
	bin := filepath.Join(dir, "root", "bin", "x")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	ino := st.Sys().(*syscall.Stat_t).Ino
	writeMaps := func(ino uint64) {
		line := fmt.Sprintf("1000-2000 r-xp 00000000 08:01 %d /bin/x\n", ino)
		if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeMaps(ino)
	n := New(Options{ProcRoot: root})
	p, err := n.Refresh(4242)
	if err != nil || len(p.Mappings) != 1 || p.Mappings[0].File.HTLHash == "" {
		t.Fatalf("first snapshot: %+v, %v", p, err)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	q, err := n.Refresh(4242)
	if err != nil {
		t.Fatal(err)
	}
	if q.Mappings[0].File != p.Mappings[0].File {
		t.Errorf("the file read before was replaced by %+v", q.Mappings[0].File)
	}
	// Another inode at that place is another file: what is known now.
	writeMaps(ino + 1)
	if r, err := n.Refresh(4242); err != nil || r.Mappings[0].File.HTLHash != "" {
		t.Errorf("another inode kept the old file: %+v, %v", r.Mappings[0].File, err)
	}
}
