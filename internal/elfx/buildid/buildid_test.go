package buildid

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

const libc = "/lib/x86_64-linux-gnu/libc.so.6"

var buildIDRE = regexp.MustCompile(`Build ID: ([0-9a-f]+)`)

// readelfBuildID is the reference: binutils' view of the GNU build id.
func readelfBuildID(t *testing.T, path string) string {
	t.Helper()
	out := testfixture.Run(t, testfixture.NeedTool(t, "readelf"), "-n", path)
	m := buildIDRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("readelf -n %s: no build id in\n%s", path, out)
	}
	return m[1]
}

func open(t *testing.T, path string) *elfx.File {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func cFixture(t *testing.T, name string, args ...string) string {
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"elf/hello.c"},
		Args: append([]string{"-O1", "-g", "-Wl,--build-id"}, args...)})
}

func TestGNUMatchesReadelf(t *testing.T) {
	bins := []string{cFixture(t, "hello"), cFixture(t, "hello-md5", "-Wl,--build-id=md5")}
	if _, err := os.Stat(libc); err == nil {
		bins = append(bins, libc)
	} else {
		testfixture.SkipPart(t, "libc", "no %s: %v", libc, err)
	}
	for _, bin := range bins {
		want := readelfBuildID(t, bin)
		got, err := GNU(open(t, bin))
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if HexString(got) != want {
			t.Errorf("%s: GNU = %s, readelf says %s", bin, HexString(got), want)
		}
	}
}

// eu-readelf is a second, independent reader.
func TestGNUMatchesEuReadelf(t *testing.T) {
	eu := testfixture.NeedTool(t, "eu-readelf")
	bin := cFixture(t, "hello")
	out := testfixture.Run(t, eu, "-n", bin)
	m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("eu-readelf: no build id in\n%s", out)
	}
	got, err := GNU(open(t, bin))
	if err != nil || HexString(got) != m[1] {
		t.Fatalf("GNU = %x, %v; eu-readelf says %s", got, err, m[1])
	}
}

// Without section headers the id must come from the PT_NOTE segment.
func TestGNUFromProgramHeaders(t *testing.T) {
	bin := cFixture(t, "hello")
	want := readelfBuildID(t, bin)
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	// Drop the section header table: e_shoff, e_shnum, e_shstrndx = 0.
	binary.LittleEndian.PutUint64(b[0x28:], 0)
	binary.LittleEndian.PutUint16(b[0x3c:], 0)
	binary.LittleEndian.PutUint16(b[0x3e:], 0)
	f, err := elfx.NewFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Sections) != 0 {
		t.Fatalf("still %d sections", len(f.Sections))
	}
	got, err := GNU(f)
	if err != nil || HexString(got) != want {
		t.Fatalf("GNU = %x, %v; want %s", got, err, want)
	}
}

func TestGNUAbsent(t *testing.T) {
	bin := cFixture(t, "hello-noid", "-Wl,--build-id=none")
	_, err := GNU(open(t, bin))
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func goFixture(t *testing.T) string {
	return testfixture.Build(t, testfixture.Spec{Name: "gobin", Lang: "go", Sources: []string{"elf/gobin"}})
}

func TestGoMatchesGoTool(t *testing.T) {
	bin := goFixture(t)
	want := strings.TrimSpace(testfixture.Run(t, testfixture.NeedTool(t, "go"), "tool", "buildid", bin))
	got, err := Go(open(t, bin))
	if err != nil || got != want {
		t.Fatalf("Go = %q, %v; go tool buildid says %q", got, err, want)
	}
	// Stripped of section headers, the note is still reachable through
	// PT_NOTE.
	b, _ := os.ReadFile(bin)
	binary.LittleEndian.PutUint64(b[0x28:], 0)
	binary.LittleEndian.PutUint16(b[0x3c:], 0)
	binary.LittleEndian.PutUint16(b[0x3e:], 0)
	f, err := elfx.NewFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Go(f); err != nil || got != want {
		t.Fatalf("sectionless Go = %q, %v; want %q", got, err, want)
	}
}

func TestGoRawString(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "goid", Lang: "c", Sources: []string{"elf/goid.c"}})
	got, err := Go(open(t, bin))
	if err != nil || got != "abcdefghij/klmnopqrst" {
		t.Fatalf("Go = %q, %v", got, err)
	}
	if _, err := Go(open(t, cFixture(t, "hello"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("C binary: err = %v, want ErrNotFound", err)
	}
}

func TestParseNotesAlignment(t *testing.T) {
	le := binary.LittleEndian
	rec := func(align int, name string, typ uint32, desc []byte) []byte {
		var b []byte
		b = le.AppendUint32(b, uint32(len(name)+1))
		b = le.AppendUint32(b, uint32(len(desc)))
		b = le.AppendUint32(b, typ)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%align != 0 {
			b = append(b, 0)
		}
		b = append(b, desc...)
		for len(b)%align != 0 {
			b = append(b, 0)
		}
		return b
	}
	for _, align := range []int{4, 8} {
		data := append(rec(align, "GNU", 5, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), rec(align, "GNU", 3, []byte{0xab, 0xcd, 0xef})...)
		var got []Note
		if err := ParseNotes(data, le, uint64(align), func(n Note) bool { got = append(got, n); return true }); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[1].Name != "GNU" || got[1].Type != 3 || !bytes.Equal(got[1].Desc, []byte{0xab, 0xcd, 0xef}) {
			t.Fatalf("align %d: %+v", align, got)
		}
	}
	// Truncated descriptor.
	bad := rec(4, "GNU", 3, []byte{1, 2, 3, 4})
	err := ParseNotes(bad[:len(bad)-2], le, 4, func(Note) bool { return true })
	if !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("truncated: err = %v", err)
	}
	if err := ParseNotes(bad, le, 16, func(Note) bool { return true }); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("align 16: err = %v", err)
	}
}

// refHTL is the spec's formula written as plainly as possible.
func refHTL(b []byte) string {
	head := b[:min(len(b), 4096)]
	tail := b[len(b)-min(len(b), 4096):]
	h := sha256.New()
	h.Write(head)
	h.Write(tail)
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(len(b)))
	h.Write(l[:])
	return HexString(h.Sum(nil)[:16])
}

// countingReader records how many bytes were read, to show that HTLHash
// does not read the whole file.
type countingReader struct {
	r    *bytes.Reader
	read int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.read += n
	return n, err
}

func TestHTLHash(t *testing.T) {
	for _, size := range []int{0, 1, 100, 4095, 4096, 4097, 8191, 8192, 8193, 1 << 20} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i*7 + i>>9)
		}
		cr := &countingReader{r: bytes.NewReader(b)}
		got, err := HTLHash(cr, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		if want := refHTL(b); got != want || len(got) != 32 {
			t.Errorf("size %d: %s, want %s", size, got, want)
		}
		if cr.read > 2*4096 {
			t.Errorf("size %d: read %d bytes", size, cr.read)
		}
	}
	// A file of one known byte, computed with sha256sum over the spec's
	// input: "a" + "a" + 0x0000000000000001.
	one := []byte("a")
	in := append(append([]byte("aa"), 0, 0, 0, 0, 0, 0, 0), 1)
	sum := sha256.Sum256(in)
	if got, _ := HTLHash(bytes.NewReader(one), 1); got != HexString(sum[:16]) {
		t.Errorf("one byte: %s", got)
	}
	// Short reads are errors, not silently hashed.
	if _, err := HTLHash(bytes.NewReader(one), 10); err == nil {
		t.Error("size beyond data: no error")
	}
}

// Cross-check against coreutils on a real file: sha256sum of head+tail+len.
func TestHTLHashRealFile(t *testing.T) {
	bin := cFixture(t, "hello")
	sh := testfixture.NeedTool(t, "bash")
	// The shell pipeline builds the spec's input with head/tail/printf.
	st, _ := os.Stat(bin)
	script := `f="$1"; n=$(stat -c %s "$f"); { head -c 4096 "$f"; tail -c 4096 "$f"; printf "$(printf '%016x' "$n" | sed 's/../\\x&/g')"; } | sha256sum | cut -c1-32`
	out, err := exec.Command(sh, "-c", script, "bash", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	osf, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer osf.Close()
	got, err := HTLHash(osf, st.Size())
	if err != nil || got != strings.TrimSpace(string(out)) {
		t.Fatalf("HTLHash = %s, %v; shell says %s", got, err, out)
	}
}

func FuzzParseNotes(f *testing.F) {
	for _, p := range []string{libc, "/bin/ls"} {
		ef, err := elfx.Open(p)
		if err != nil {
			continue
		}
		for _, s := range ef.Sections {
			if strings.HasPrefix(s.Name, ".note") {
				if d, err := ef.SectionData(s.Name); err == nil {
					f.Add(bytes.Clone(d), uint8(s.Addralign))
				}
			}
		}
		ef.Close()
	}
	f.Add([]byte{4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0, 'G', 'N', 'U', 0}, uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, align uint8) {
		n := 0
		err := ParseNotes(data, binary.LittleEndian, uint64(align), func(note Note) bool {
			n++
			if len(note.Desc) > len(data) || len(note.Name) > len(data) {
				t.Fatalf("note larger than input")
			}
			return true
		})
		if err != nil && !errors.Is(err, frame.ErrCorruptFile) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		if n > len(data)/12+1 {
			t.Fatalf("%d notes from %d bytes", n, len(data))
		}
	})
}

// FuzzGNU runs the whole path, ELF parsing included, on mutated real files.
func FuzzGNU(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	for _, p := range []string{"/bin/true"} {
		if b, err := os.ReadFile(p); err == nil && len(b) < 1<<20 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elfx.NewFile(data)
		if err != nil {
			return
		}
		GNU(ef)
		Go(ef)
	})
}
