package runtimes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
)

// Loaded on forged /proc/PID/maps: a library mapped as ld.so leaves it
// between its mmaps, before and after relocation, and maps text past the
// bound on what is read.
func TestLoadedForgedMaps(t *testing.T) {
	const lib = "/usr/lib/libpython3.12.so.1.0"
	file := &normalize.FileInfo{Loads: []elfx.Segment{
		{Off: 0, Vaddr: 0, Filesz: 0x5000},
		{Off: 0x5000, Vaddr: 0x5000, Filesz: 0x3000},
		{Off: 0x8e00, Vaddr: 0x9e00, Filesz: 0x2200, Memsz: 0x4000},
	}, Relro: elfx.Segment{Off: 0x8e00, Vaddr: 0x9e00, Memsz: 0x1200}}
	code := &normalize.Mapping{Start: 0x7f0000005000, End: 0x7f0000008000, Offset: 0x5000, Path: lib, File: file}
	line := func(start, end uint64, perms string, off uint64, path string) string {
		return fmt.Sprintf("%x-%x %s %08x 08:01 1234 %s\n", start, end, perms, off, path)
	}
	base := uint64(0x7f0000000000)
	span := line(base, base+0xe000, "r--p", 0, lib) // ld.so's first mmap
	head := line(base, base+0x5000, "r--p", 0, lib) + line(base+0x5000, base+0x8000, "r-xp", 0x5000, lib)
	data := line(base+0x9000, base+0xc000, "rw-p", 0x8000, lib) + line(base+0xc000, base+0xe000, "rw-p", 0, "")
	relocated := line(base+0x9000, base+0xb000, "r--p", 0x8000, lib) +
		line(base+0xb000, base+0xc000, "rw-p", 0xa000, lib) + line(base+0xc000, base+0xe000, "rw-p", 0, "")
	for _, c := range []struct {
		name, maps string
		loaded     bool
	}{
		{"one span", span, false},
		{"code over the span", line(base, base+0x5000, "r--p", 0, lib) + line(base+0x5000, base+0x8000, "r-xp", 0x5000, lib) +
			line(base+0x8000, base+0xe000, "r--p", 0x8000, lib), false},
		{"data mapped, not relocated", head + data, false},
		{"relocated", head + relocated, true},
		{"a partial line", head + relocated[:20], false},
		{"another file there", head + strings.ReplaceAll(relocated, lib, "/tmp/other"), false},
		{"past the bound", strings.Repeat(line(0x1000, 0x2000, "r--p", 0, "/x"), maxMapsBytes/38) + head + relocated, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "7"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "7", "maps"), []byte(c.maps), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Loaded(root, 7, code)
			if c.name == "past the bound" && !errors.Is(err, frame.ErrLimitExceeded) {
				t.Fatalf("Loaded: %v; want %v", err, frame.ErrLimitExceeded)
			}
			if c.loaded && err != nil || !c.loaded && err == nil {
				t.Fatalf("Loaded: %v; want loaded %v", err, c.loaded)
			}
		})
	}
}
