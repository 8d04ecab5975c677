package perfmap

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

func mustParse(t testing.TB, s string) *Map {
	t.Helper()
	m, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParse(t *testing.T) {
	in := "" +
		"3ef414d0 84 LazyCompile:~foo /app/x.js:1\n" + // V8 style, no 0x
		"0x00007fcfc8ec7620 0x00000000000000b8 long Hot.spin(long)\n" + // JVM style
		"7f0000001000\t20\tInterpreter\r\n" + // tabs, CRLF
		"not a line\n" +
		"7f0000002000 0 zero_size\n" +
		"ffffffffffffff00 1000 wraps\n" +
		"7f0000003000 10\n" + // no name
		"7f0000003000 zz bad_size\n" +
		"\n" +
		"7f0000004000 " + strings.Repeat("x", MaxLineLen) + "\n" + // over-long
		"7f0000005000 10 after_long\n" +
		"7f0000006000 10 unfinished" // no newline: may be mid-write
	m := mustParse(t, in)
	for _, c := range []struct {
		addr  uint64
		name  string
		start uint64
	}{
		{0x3ef414d0, "LazyCompile:~foo /app/x.js:1", 0x3ef414d0},
		{0x3ef414d0 + 0x83, "LazyCompile:~foo /app/x.js:1", 0x3ef414d0},
		{0x7fcfc8ec7620 + 0x10, "long Hot.spin(long)", 0x7fcfc8ec7620},
		{0x7f0000001000 + 0x1f, "Interpreter", 0x7f0000001000},
		{0x7f0000005000, "after_long", 0x7f0000005000},
	} {
		name, start, ok := m.Lookup(c.addr)
		if !ok || name != c.name || start != c.start {
			t.Errorf("Lookup(%#x) = %q %#x %v; want %q %#x", c.addr, name, start, ok, c.name, c.start)
		}
	}
	for _, addr := range []uint64{0, 0x3ef414d0 + 0x84, 0x7f0000002000, 0x7f0000003000, 0x7f0000004000, 0x7f0000006000, ^uint64(0)} {
		if name, _, ok := m.Lookup(addr); ok {
			t.Errorf("Lookup(%#x) = %q; want a miss", addr, name)
		}
	}
	if m.Len() != 4 || m.Skipped() != 7 {
		t.Errorf("Len %d Skipped %d", m.Len(), m.Skipped())
	}
	if n := testing.AllocsPerRun(100, func() { m.Lookup(0x3ef414d0) }); n != 0 {
		t.Errorf("Lookup allocates %v", n)
	}
}

// naive is the oracle: the last line in the file covering addr wins.
type naiveEnt struct {
	start, end uint64
	name       string
}

func naive(ents []naiveEnt, addr uint64) (string, uint64, bool) {
	for i := len(ents) - 1; i >= 0; i-- {
		if e := ents[i]; e.start <= addr && addr < e.end {
			return e.name, e.start, true
		}
	}
	return "", 0, false
}

func render(ents []naiveEnt) string {
	var b strings.Builder
	for _, e := range ents {
		fmt.Fprintf(&b, "%x %x %s\n", e.start, e.end-e.start, e.name)
	}
	return b.String()
}

func TestOverlap(t *testing.T) {
	ents := []naiveEnt{
		{0x1000, 0x2000, "old_big"},
		{0x1400, 0x1800, "new_inside"},     // splits old_big in two
		{0x1f00, 0x2100, "new_straddle"},   // takes old_big's tail and more
		{0x1500, 0x1600, "newest_inside"},  // inside new_inside
		{0x0f00, 0x1100, "new_head"},       // takes old_big's head
		{0x3000, 0x3100, "a"},              //
		{0x3000, 0x3100, "a_again"},        // same range rewritten
		{0x4000, 0x4100, "later_disjoint"}, //
		{0x3f00, 0x4200, "covers_all"},     // swallows later_disjoint
	}
	m := mustParse(t, render(ents))
	for _, addr := range []uint64{0xeff, 0xf00, 0x10ff, 0x1100, 0x13ff, 0x1400, 0x14ff, 0x1500, 0x15ff, 0x1600, 0x17ff, 0x1800,
		0x1eff, 0x1f00, 0x20ff, 0x2100, 0x3000, 0x30ff, 0x3100, 0x3eff, 0x3f00, 0x4000, 0x40ff, 0x41ff, 0x4200} {
		wn, ws, wok := naive(ents, addr)
		gn, gs, gok := m.Lookup(addr)
		if wn != gn || ws != gs || wok != gok {
			t.Errorf("Lookup(%#x) = %q %#x %v; want %q %#x %v", addr, gn, gs, gok, wn, ws, wok)
		}
	}
	// Fully hidden symbols are dropped; old_big keeps its original start.
	if name, start, _ := m.Lookup(0x1200); name != "old_big" || start != 0x1000 {
		t.Errorf("old_big middle: %q %#x", name, start)
	}
	for _, name := range []string{"a", "later_disjoint"} {
		for _, n := range m.Symbols() {
			if n == name {
				t.Errorf("%s is fully overwritten but still listed", name)
			}
		}
	}
}

// TestOverlapRandom compares against the oracle on dense random overlaps.
func TestOverlapRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		var ents []naiveEnt
		for i := 0; i < 1+r.IntN(40); i++ {
			s := uint64(r.IntN(400))
			ents = append(ents, naiveEnt{s, s + 1 + uint64(r.IntN(80)), fmt.Sprintf("f%d", i)})
		}
		m := mustParse(t, render(ents))
		for addr := uint64(0); addr < 500; addr++ {
			wn, ws, wok := naive(ents, addr)
			gn, gs, gok := m.Lookup(addr)
			if wn != gn || ws != gs || wok != gok {
				t.Fatalf("iter %d: Lookup(%d) = %q %d %v; want %q %d %v\n%s", iter, addr, gn, gs, gok, wn, ws, wok, render(ents))
			}
		}
	}
}

func TestBounds(t *testing.T) {
	// Over-long lines are skipped without being buffered whole.
	m := mustParse(t, strings.Repeat("y", 3*MaxLineLen)+"\n1000 10 ok\n")
	if name, _, ok := m.Lookup(0x1000); !ok || name != "ok" || m.Skipped() != 1 {
		t.Fatalf("after long line: %q %v skipped %d", name, ok, m.Skipped())
	}
	// More than MaxFileSize bytes is refused, without reading it all.
	big := &repeatReader{line: []byte("1000 10 filler\n"), n: MaxFileSize/15 + 2}
	if _, err := Parse(big); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("huge file: %v", err)
	}
	if m := mustParse(t, ""); m.Len() != 0 {
		t.Fatal("empty map has symbols")
	}
	if _, _, ok := mustParse(t, "").Lookup(0); ok {
		t.Fatal("empty map hit")
	}
}

type repeatReader struct {
	line []byte
	n    int
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, fmt.Errorf("read past the end")
	}
	n := 0
	for n < len(p) && r.n > 0 {
		c := copy(p[n:], r.line[r.off:])
		n += c
		if r.off += c; r.off == len(r.line) {
			r.off = 0
			r.n--
		}
	}
	return n, nil
}

func BenchmarkParse(b *testing.B) {
	var buf bytes.Buffer
	for i := 0; i < 100000; i++ {
		fmt.Fprintf(&buf, "0x%016x 0x%016x void org.example.Class%d.method(java.lang.String, int)\n", 0x7f0000000000+uint64(i)*0x100, 0x80+i%0x100, i)
	}
	b.SetBytes(int64(buf.Len()))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(bytes.NewReader(buf.Bytes())); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("3ef414d0 84 LazyCompile:~foo /app/x.js:1\n1000 10 a\n1008 10 b\n"))
	f.Add([]byte(render([]naiveEnt{{0x1000, 0x2000, "x"}, {0x1400, 0x1800, "y"}, {0x0f00, 0x1100, "z"}})))
	// Whole lines of a real JDK 17 map, head and tail (where the compiled
	// methods and the repeated entries are); small seeds keep minimization
	// quick.
	if data, err := os.ReadFile("testdata/jdk17.map"); err == nil {
		lines := bytes.SplitAfter(data, []byte("\n"))
		f.Add(bytes.Join(lines[:min(len(lines), 20)], nil))
		f.Add(bytes.Join(lines[max(0, len(lines)-20):], nil))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		// Rebuild the oracle from the lines Parse accepted and compare at
		// every boundary, and just before it.
		var ents []naiveEnt
		lines := bytes.Split(data, []byte("\n"))
		for _, l := range lines[:len(lines)-1] { // the last piece has no newline
			if len(l) > MaxLineLen {
				continue
			}
			s, n, name, ok := parseLine(l)
			if ok && n != 0 && s+n >= s {
				ents = append(ents, naiveEnt{s, s + n, string(name)})
			}
		}
		for _, e := range ents {
			for _, addr := range []uint64{e.start - 1, e.start, e.end - 1, e.end} {
				wn, ws, wok := naive(ents, addr)
				gn, gs, gok := m.Lookup(addr)
				if wn != gn || ws != gs || wok != gok {
					t.Fatalf("Lookup(%#x) = %q %#x %v; want %q %#x %v", addr, gn, gs, gok, wn, ws, wok)
				}
			}
		}
		if m.Len() > len(ents) {
			t.Fatalf("%d symbols from %d entries", m.Len(), len(ents))
		}
	})
}

// TestJDK17File parses a map written by OpenJDK 17's jcmd Compiler.perfmap:
// "0x"-prefixed, zero-padded fields and names such as "long Hot.spin(long)",
// "Interpreter" and "I2C/C2I adapters".
func TestJDK17File(t *testing.T) {
	data, err := os.ReadFile("testdata/jdk17.map")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if m.Skipped() != 0 {
		t.Errorf("%d lines skipped", m.Skipped())
	}
	want := map[string]bool{"long Hot.spin(long)": false, "Interpreter": false, "I2C/C2I adapters": false, "StubRoutines (1)": false}
	for start, name := range m.Symbols() {
		if _, ok := want[name]; ok {
			want[name] = true
		}
		// The start may belong to a later entry, but never to nothing.
		if _, _, ok := m.Lookup(start); !ok {
			t.Errorf("Lookup(%#x) for %q missed", start, name)
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("%q not found", name)
		}
	}
}
