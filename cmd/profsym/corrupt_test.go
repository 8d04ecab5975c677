package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// mutation sets one little-endian field of an ELF image.
type mutation struct {
	name      string
	off, size int
	val       uint64
}

func (m mutation) apply(img []byte) []byte {
	d := bytes.Clone(img)
	switch m.size {
	case 2:
		binary.LittleEndian.PutUint16(d[m.off:], uint16(m.val))
	case 4:
		binary.LittleEndian.PutUint32(d[m.off:], uint32(m.val))
	default:
		binary.LittleEndian.PutUint64(d[m.off:], m.val)
	}
	return d
}

// mutations is a deterministic set of corruptions of a 64-bit
// little-endian ELF image: its header's table offsets, counts and sizes,
// the offset, size, entry size, link and flags of every section the
// symbolizer reads, and each
// compression header's claimed size, each set to values that real
// corruption produces (zero, all ones, one flipped high bit, off by one, a
// large power of two).
func mutations(t *testing.T, img []byte) []mutation {
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil || f.Class != elf.ELFCLASS64 || f.ByteOrder != binary.LittleEndian {
		t.Fatalf("not a 64-bit little-endian ELF image: %v", err)
	}
	rd := func(off, size int) uint64 {
		switch size {
		case 2:
			return uint64(binary.LittleEndian.Uint16(img[off:]))
		case 4:
			return uint64(binary.LittleEndian.Uint32(img[off:]))
		}
		return binary.LittleEndian.Uint64(img[off:])
	}
	values := func(size int, cur uint64) []uint64 {
		top := uint64(1) << (8*size - 1)
		vs := []uint64{0, cur + 1, cur ^ top, ^uint64(0) >> (64 - 8*size)}
		if size == 8 {
			vs = append(vs, cur^1<<28, cur^1<<31)
		}
		return vs
	}
	var out []mutation
	add := func(name string, off, size int) {
		for _, v := range values(size, rd(off, size)) {
			out = append(out, mutation{name, off, size, v})
		}
	}
	for _, h := range []struct {
		name      string
		off, size int
	}{{"e_phoff", 0x20, 8}, {"e_shoff", 0x28, 8}, {"e_phentsize", 0x36, 2}, {"e_phnum", 0x38, 2},
		{"e_shentsize", 0x3a, 2}, {"e_shnum", 0x3c, 2}, {"e_shstrndx", 0x3e, 2}} {
		add(h.name, h.off, h.size)
	}
	shoff := int(rd(0x28, 8))
	for i, s := range f.Sections {
		if !readByUs(s) {
			continue
		}
		for _, fl := range []struct {
			name      string
			off, size int
		}{{"sh_flags", 0x08, 8}, {"sh_offset", 0x18, 8}, {"sh_size", 0x20, 8}, {"sh_link", 0x28, 4}, {"sh_entsize", 0x38, 8}} {
			add(fmt.Sprintf("[%d]%s.%s", i, s.Name, fl.name), shoff+i*64+fl.off, fl.size)
		}
		if s.Flags&elf.SHF_COMPRESSED != 0 && s.Offset+24 <= uint64(len(img)) {
			add(s.Name+".ch_size", int(s.Offset)+8, 8)
		}
	}
	return out
}

// readByUs reports whether the symbolizer reads s: symbol, string, note,
// version and pclntab sections, compressed ones and DWARF.
func readByUs(s *elf.Section) bool {
	switch s.Type {
	case elf.SHT_SYMTAB, elf.SHT_DYNSYM, elf.SHT_STRTAB, elf.SHT_NOTE,
		elf.SHT_GNU_VERSYM, elf.SHT_GNU_VERNEED, elf.SHT_GNU_VERDEF:
		return true
	}
	return s.Flags&elf.SHF_COMPRESSED != 0 || s.Flags&elf.SHF_EXECINSTR != 0 ||
		strings.HasPrefix(s.Name, ".debug_") || s.Name == ".gopclntab" || s.Name == ".gnu_debuglink"
}

// Corrupted copies of real binaries (a C program with zlib-compressed DWARF
// and profsym itself, a Go program) go through the built `profsym
// symbolize` under a 2 GiB address-space limit, as in issue 31: every run
// ends by itself, with an answer or an error, never "fatal error: out of
// memory", a panic, a signal or a hang.
func TestCorruptELFUnderAddressSpaceLimit(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		testfixture.SkipOrFail(t, "needs a 64-bit little-endian Linux")
	}
	prlimit := testfixture.NeedTool(t, "prlimit")
	gotool := testfixture.NeedTool(t, "go")
	dir := t.TempDir()
	self := filepath.Join(dir, "profsym")
	if out, err := exec.Command(gotool, "build", "-o", self, ".").CombinedOutput(); err != nil {
		t.Fatalf("building profsym: %v\n%s", err, out)
	}
	cfix := testfixture.Build(t, testfixture.Spec{Name: "cli-corrupt-gz", Lang: "c",
		Sources: []string{"engine/c/main.c", "engine/c/hash.c", "engine/c/sort.c"}, Args: []string{"-O2", "-g", "-gz=zlib"}})
	bins := []struct {
		path string
		fn   string
	}{{cfix, "hot"}, {self, "main.main"}}
	if testing.Short() {
		bins = bins[:1]
	}
	target := filepath.Join(dir, "corrupt")
	runs := 0
	for _, b := range bins {
		img, err := os.ReadFile(b.path)
		if err != nil {
			t.Fatal(err)
		}
		addr := funcAddrs(t, b.path, b.fn)[0]
		for _, m := range mutations(t, img) {
			if err := os.WriteFile(target, m.apply(img), 0o644); err != nil {
				t.Fatal(err)
			}
			runs++
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			cmd := exec.CommandContext(ctx, prlimit, "--as=2147483648", self, "symbolize", "--obj="+target, addr)
			// The collector hold is on, as for a user who sets neither.
			cmd.Env = append(os.Environ(), "GOGC=", "GOMEMLIMIT=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			err := cmd.Run()
			hung := ctx.Err() != nil
			cancel()
			what := fmt.Sprintf("%s with %s=%#x", filepath.Base(b.path), m.name, m.val)
			switch {
			case hung:
				t.Errorf("%s: still running after a minute", what)
			case !cmd.ProcessState.Exited():
				t.Errorf("%s: %v\n%.2000s", what, cmd.ProcessState, stderr.String())
			case strings.Contains(stderr.String(), "fatal error") || strings.Contains(stderr.String(), "panic:"):
				t.Errorf("%s: exit %d after %v\n%.2000s", what, cmd.ProcessState.ExitCode(), time.Since(start), stderr.String())
			case err != nil && cmd.ProcessState.ExitCode() > 2:
				t.Errorf("%s: exit %d\n%.2000s", what, cmd.ProcessState.ExitCode(), stderr.String())
			}
		}
	}
	t.Logf("%d corrupted copies symbolized under a 2 GiB address-space limit", runs)
}
