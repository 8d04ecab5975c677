package debugdirs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

func build(t testing.TB, name string, args ...string) string {
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"elf/hello.c"},
		Args: append([]string{"-O1", "-g", "-Wl,--build-id"}, args...)})
}

func open(t testing.TB, p string) *elfx.File {
	t.Helper()
	f, err := elfx.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func gnuID(t testing.TB, p string) []byte {
	t.Helper()
	id, err := buildid.GNU(open(t, p))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The CRC recorded by objcopy --add-gnu-debuglink is the one we compute.
func TestDebugLinkMatchesObjcopy(t *testing.T) {
	stripped, debug := testfixture.SplitDebug(t, build(t, "hello"), true)
	name, crc, ok := DebugLink(open(t, stripped))
	if !ok || name != filepath.Base(debug) {
		t.Fatalf("DebugLink = %q %08x %v", name, crc, ok)
	}
	got, err := FileCRC(debug)
	if err != nil || got != crc {
		t.Fatalf("FileCRC = %08x, %v; link says %08x", got, err, crc)
	}
	if _, _, ok := DebugLink(open(t, build(t, "hello"))); ok {
		t.Error("unlinked binary has a debuglink")
	}
}

func TestFindByDebugLinkLocations(t *testing.T) {
	bin := build(t, "hello")
	for _, where := range []string{"same", "dotdebug", "debugdir"} {
		t.Run(where, func(t *testing.T) {
			stripped, debug := testfixture.SplitDebug(t, bin, true)
			debugDir := t.TempDir()
			want := debug
			switch where {
			case "dotdebug":
				want = filepath.Join(filepath.Dir(stripped), ".debug", filepath.Base(debug))
			case "debugdir":
				want = filepath.Join(debugDir, filepath.Dir(stripped), filepath.Base(debug))
			}
			if want != debug {
				copyFile(t, debug, want)
				os.Remove(debug)
			}
			got, err := Find(stripped, open(t, stripped), nil, []string{debugDir})
			if err != nil || got != want {
				t.Fatalf("Find = %q, %v; want %q", got, err, want)
			}
		})
	}
}

func TestFindByBuildIDFirst(t *testing.T) {
	bin := build(t, "hello")
	stripped, debug := testfixture.SplitDebug(t, bin, true)
	debugDir := t.TempDir()
	id := buildid.HexString(gnuID(t, bin))
	want := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
	copyFile(t, debug, want)
	got, err := Find(stripped, open(t, stripped), nil, []string{t.TempDir(), debugDir})
	if err != nil || got != want {
		t.Fatalf("Find = %q, %v; want %q", got, err, want)
	}
	// f may be nil: build id only.
	got, err = Find("", nil, gnuID(t, bin), []string{debugDir})
	if err != nil || got != want {
		t.Fatalf("Find(nil f) = %q, %v", got, err)
	}
}

func TestFindRejectsTamperedCRC(t *testing.T) {
	stripped, _ := testfixture.SplitDebug(t, build(t, "hello"), true)
	f := open(t, stripped)
	s := f.Section(".gnu_debuglink")
	b, _ := os.ReadFile(stripped)
	// Flip a bit of the stored CRC (the section's last 4 bytes).
	b[s.Offset+s.Size-1] ^= 0x40
	if err := os.WriteFile(stripped, b, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Find(stripped, open(t, stripped), nil, []string{t.TempDir()})
	if !errors.Is(err, frame.ErrBuildIDMismatch) {
		t.Fatalf("err = %v, want build_id_mismatch", err)
	}
}

// A debug file of another build is never used, whether found by build-id
// path or by a debuglink whose CRC matches it.
func TestFindRejectsOtherBuild(t *testing.T) {
	a := build(t, "hello")
	other := build(t, "hello-other", "-DOTHER_BUILD=1", "-O2")
	if bytes.Equal(gnuID(t, a), gnuID(t, other)) {
		t.Fatal("fixtures share a build id")
	}
	_, otherDebug := testfixture.SplitDebug(t, other, false)

	// By build-id path: the other build's file planted under a's id.
	debugDir := t.TempDir()
	id := buildid.HexString(gnuID(t, a))
	copyFile(t, otherDebug, filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug"))
	_, err := Find(a, open(t, a), nil, []string{debugDir})
	if !errors.Is(err, frame.ErrBuildIDMismatch) {
		t.Fatalf("build-id path: err = %v", err)
	}

	// By debuglink: a's stripped copy linked (CRC and all) to other's
	// debug file.
	dir := t.TempDir()
	linked := filepath.Join(dir, "hello")
	planted := filepath.Join(dir, "hello.debug")
	copyFile(t, otherDebug, planted)
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--strip-all", "--add-gnu-debuglink="+planted, a, linked)
	_, err = Find(linked, open(t, linked), nil, []string{t.TempDir()})
	if !errors.Is(err, frame.ErrBuildIDMismatch) {
		t.Fatalf("debuglink: err = %v", err)
	}
	if !strings.Contains(err.Error(), planted) {
		t.Errorf("error does not name the candidate: %v", err)
	}

	// With the right file also present under the build-id path, that one
	// wins and the wrong one is never looked at.
	_, aDebug := testfixture.SplitDebug(t, a, false)
	good := t.TempDir()
	copyFile(t, aDebug, filepath.Join(good, ".build-id", id[:2], id[2:]+".debug"))
	if p, err := Find(linked, open(t, linked), nil, []string{debugDir, good}); err != nil || !strings.HasPrefix(p, good) {
		t.Fatalf("Find = %q, %v", p, err)
	}
}

func TestFindNothing(t *testing.T) {
	stripped, debug := testfixture.SplitDebug(t, build(t, "hello"), true)
	os.Remove(debug)
	_, err := Find(stripped, open(t, stripped), nil, []string{t.TempDir()})
	if !errors.Is(err, frame.ErrNoDebugInfo) || errors.Is(err, frame.ErrBuildIDMismatch) {
		t.Fatalf("err = %v, want no_debug_info", err)
	}
}

// The system libc and the libc6-dbg package's file.
func TestFindLibc(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	f, err := elfx.Open(libc)
	if err != nil {
		testfixture.SkipOrFail(t, "%s: %v", libc, err)
	}
	defer f.Close()
	id, err := buildid.GNU(f)
	if err != nil {
		t.Fatal(err)
	}
	hexID := buildid.HexString(id)
	want := filepath.Join(DefaultDebugDir, ".build-id", hexID[:2], hexID[2:]+".debug")
	if _, err := os.Stat(want); err != nil {
		testfixture.SkipOrFail(t, "libc6-dbg not installed (%s)", want)
	}
	got, err := Find(libc, f, nil, nil)
	if err != nil || got != want {
		t.Fatalf("Find = %q, %v; want %q", got, err, want)
	}
	// Its debug file carries DWARF for the same build.
	df := open(t, got)
	if !df.HasSection(".debug_info") {
		t.Error("no .debug_info in libc's debug file")
	}
	// Debian's libc links to a name only found through the build-id
	// folder; the build-id search above is what finds it.
	if name, _, ok := DebugLink(f); ok {
		t.Logf("libc debuglink: %s", name)
	}
}

func TestParseDebugLink(t *testing.T) {
	le := binary.LittleEndian
	mk := func(name string, crc uint32) []byte {
		b := append([]byte(name), 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return le.AppendUint32(b, crc)
	}
	for _, name := range []string{"a", "abc", "abcd", "libc.so.6.debug"} {
		n, c, ok := ParseDebugLink(mk(name, 0xdeadbeef), le)
		if !ok || n != name || c != 0xdeadbeef {
			t.Errorf("%q: %q %x %v", name, n, c, ok)
		}
	}
	for _, bad := range [][]byte{nil, {0}, []byte("abc"), mk("../x", 1), mk("a/b", 1), mk("..", 1), mk("abc", 1)[:6]} {
		if _, _, ok := ParseDebugLink(bad, le); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseDebugLink(f *testing.F) {
	stripped, _ := testfixture.SplitDebug(f, build(f, "hello"), true)
	ef, err := elfx.Open(stripped)
	if err != nil {
		f.Fatal(err)
	}
	d, _ := ef.SectionData(".gnu_debuglink")
	f.Add(bytes.Clone(d))
	ef.Close()
	if lf, err := elfx.Open("/lib/x86_64-linux-gnu/libc.so.6"); err == nil {
		if d, err := lf.SectionData(".gnu_debuglink"); err == nil {
			f.Add(bytes.Clone(d))
		}
		lf.Close()
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		name, _, ok := ParseDebugLink(data, binary.LittleEndian)
		if ok && (name == "" || strings.ContainsAny(name, "/\x00") || len(name) >= len(data)) {
			t.Fatalf("bad name %q", name)
		}
	})
}

// The CRC of a debuglink candidate reads the whole file: a FIFO in a debug
// folder used to block that read forever, and a sparse terabyte to take
// minutes. Both are refused up front.
func TestFileCRCHostile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.debug")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FileCRC(fifo); !errors.Is(err, frame.ErrInvalidPath) {
		t.Errorf("FileCRC(fifo) = %v, want %v", err, frame.ErrInvalidPath)
	}
	huge := filepath.Join(dir, "huge.debug")
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<40); err != nil {
		testfixture.SkipOrFail(t, "no sparse files here: %v", err)
	}
	if _, err := FileCRC(huge); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("FileCRC(1 TiB) = %v, want %v", err, frame.ErrLimitExceeded)
	}
}
