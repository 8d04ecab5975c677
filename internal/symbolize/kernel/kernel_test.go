package kernel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// sample mimics /proc/kallsyms: aliases at one address, a weak symbol,
// non-text symbols that bound the text before them, _etext, init text past
// it, and two modules.
const sample = `ffffffff81000000 T srso_alias_untrain_ret
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000000 T __pi__text
ffffffff81000040 t local_fn
ffffffff81000080 W weak_fn
ffffffff81000080 t strong_local
ffffffff81000100 T vfs_read
ffffffff81000200 T last_core
ffffffff81000300 T _etext
ffffffff81000300 D some_data
ffffffff81000400 A absolute_thing
ffffffff82000000 t init_fn
ffffffffc0001000 t mod_a_fn	[mod_a]
ffffffffc0001080 T mod_a_fn2	[mod_a]
ffffffffc0001100 d mod_a_data	[mod_a]
ffffffffc0100000 t mod_b_fn	[mod_b]
ffffffffc0211000 t ftrace_trampoline	[__builtin__ftrace]
`

func mustParse(t testing.TB, s string) *Table {
	t.Helper()
	tab, err := ParseKallsyms(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func TestParseSample(t *testing.T) {
	tab := mustParse(t, sample)
	for _, c := range []struct {
		addr  uint64
		name  string
		mod   string
		start uint64
	}{
		{0xffffffff81000000, "srso_alias_untrain_ret", "", 0xffffffff81000000},
		{0xffffffff8100003f, "srso_alias_untrain_ret", "", 0xffffffff81000000},
		{0xffffffff81000040, "local_fn", "", 0xffffffff81000040},
		{0xffffffff81000090, "strong_local", "", 0xffffffff81000080}, // local beats weak
		{0xffffffff81000180, "vfs_read", "", 0xffffffff81000100},
		{0xffffffff810002ff, "last_core", "", 0xffffffff81000200},
		{0xffffffff82000010, "init_fn", "", 0xffffffff82000000},
		{0xffffffffc0001010, "mod_a_fn", "mod_a", 0xffffffffc0001000},
		{0xffffffffc00010ff, "mod_a_fn2", "mod_a", 0xffffffffc0001080}, // ends at data
		{0xffffffffc0100010, "mod_b_fn", "mod_b", 0xffffffffc0100000},
		{0xffffffffc0211004, "ftrace_trampoline", "__builtin__ftrace", 0xffffffffc0211000},
	} {
		name, mod, start, ok := tab.Lookup(c.addr)
		if !ok || name != c.name || mod != c.mod || start != c.start {
			t.Errorf("Lookup(%#x) = %q %q %#x %v; want %q %q %#x", c.addr, name, mod, start, ok, c.name, c.mod, c.start)
		}
	}
	for _, addr := range []uint64{
		0, 0xffffffff80ffffff,
		0xffffffff81000300,         // _etext itself is a marker, followed by data
		0xffffffffc0001100,         // module data, not text
		0xffffffffc0100000 + 1<<20, // past the 1 MiB cap of the last module symbol
		0xffffffffc0211000 + 1<<20, // same for the trampoline
		0xffffffff82000000 + 1<<20, // and for init text
		0xffffffffc0001000 - 1,     // just before the module's first symbol
		^uint64(0),
	} {
		if name, mod, start, ok := tab.Lookup(addr); ok {
			t.Errorf("Lookup(%#x) = %q %q %#x; want a miss", addr, name, mod, start)
		}
	}
	if s, e := tab.CoreText(); s != 0xffffffff81000000 || e != 0xffffffff81000300 {
		t.Errorf("CoreText = %#x-%#x", s, e)
	}
	if got := tab.Modules(); strings.Join(got, ",") != "mod_a,mod_b,__builtin__ftrace" {
		t.Errorf("Modules = %v", got)
	}
}

// The last core symbol stops at _etext even when the next symbol is far away.
func TestEtextBound(t *testing.T) {
	tab := mustParse(t, "ffffffff81000000 T _stext\nffffffff81000100 T tail\nffffffff81000180 T _etext\nffffffffa0000000 t m\t[m]\n")
	if _, _, _, ok := tab.Lookup(0xffffffff81000180); ok {
		t.Error("lookup at _etext hit")
	}
	if name, _, _, ok := tab.Lookup(0xffffffff8100017f); !ok || name != "tail" {
		t.Errorf("lookup before _etext = %q %v", name, ok)
	}
}

func TestHidden(t *testing.T) {
	_, err := ParseKallsyms(strings.NewReader("0000000000000000 T _stext\n0000000000000000 t foo\t[bar]\n"))
	if !errors.Is(err, ErrAddressesHidden) || !strings.Contains(err.Error(), "kptr_restrict") {
		t.Fatalf("err = %v", err)
	}
	if !errors.Is(err, frame.ErrNoDebugInfo) {
		t.Fatalf("%v does not wrap no_debug_info", err)
	}
}

func TestMalformed(t *testing.T) {
	for _, in := range []string{
		"zzzz T foo\n",
		"ffffffff81000000T foo\n",
		"ffffffff81000000 T \n",
		"11111111111111111 T foo\n", // 17 digits overflow
		"ffffffff81000000 T foo\t[mod\n",
		"ffffffff81000000 T foo\t\n",
		"ffffffff81000000 T " + strings.Repeat("x", MaxLineLen) + "\n",
		"ffffffff81000000 T " + strings.Repeat("x", 70000) + "\n",
	} {
		if _, err := ParseKallsyms(strings.NewReader(in)); !errors.Is(err, frame.ErrCorruptFile) {
			t.Errorf("%.40q: err = %v", in, err)
		}
	}
	// Empty input is an empty table, and blank lines are ignored.
	tab := mustParse(t, "\n\nffffffff81000000 T foo\n\n")
	if tab.Len() != 1 {
		t.Errorf("Len = %d", tab.Len())
	}
}

func TestLookupAllocs(t *testing.T) {
	tab := mustParse(t, sample)
	n := testing.AllocsPerRun(1000, func() {
		tab.Lookup(0xffffffff81000180)
		tab.Lookup(0xffffffffc0001010)
		tab.Lookup(1)
	})
	if n != 0 {
		t.Fatalf("Lookup allocates %v times", n)
	}
}

// hostKallsyms reads the real /proc/kallsyms or skips (fails under CI) when
// it is unreadable or its addresses are hidden.
func hostKallsyms(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		testfixture.SkipOrFail(t, "reading /proc/kallsyms: %v", err)
	}
	return data
}

func TestHostKallsyms(t *testing.T) {
	data := hostKallsyms(t)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	tab, err := ParseKallsyms(bytes.NewReader(data))
	took := time.Since(t0)
	if errors.Is(err, ErrAddressesHidden) {
		testfixture.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	runtime.ReadMemStats(&after)
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(tab)
	t.Logf("%d lines (%d bytes) -> %d symbols, %d modules; parse %v; allocated %.1f MiB, retained %.1f MiB",
		bytes.Count(data, []byte("\n")), len(data), tab.Len(), len(tab.Modules()), took,
		float64(allocated)/(1<<20), float64(retained)/(1<<20))
	// ~18 bytes per symbol plus its name; 200k symbols must stay under 15 MB.
	if perSym := float64(retained) / float64(tab.Len()); perSym*200e3 > 15e6 {
		t.Errorf("%.0f bytes per symbol retained", perSym)
	}

	// Every text symbol's own address must name a symbol at that address
	// (an alias when several share it), and vfs_read must name itself.
	sc := bufio.NewScanner(bytes.NewReader(data))
	var vfsRead uint64
	checked := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || !strings.ContainsAny(f[1], "tTwW") {
			continue
		}
		addr, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if f[2] == "vfs_read" && len(f) == 3 {
			vfsRead = addr
		}
		if _, _, start, ok := tab.Lookup(addr); !ok || start != addr {
			// The end markers are the only expected misses.
			if f[2] != "_etext" && f[2] != "_einittext" {
				t.Errorf("Lookup(%#x) for %s = start %#x, %v", addr, f[2], start, ok)
			}
		}
		checked++
	}
	if vfsRead == 0 {
		t.Fatal("vfs_read not in /proc/kallsyms")
	}
	for _, off := range []uint64{0, 1, 0x10, 0x40} {
		name, mod, start, ok := tab.Lookup(vfsRead + off)
		if !ok || name != "vfs_read" || mod != "" || start != vfsRead {
			t.Errorf("Lookup(vfs_read+%#x) = %q %q %#x %v", off, name, mod, start, ok)
		}
	}
	t.Logf("checked %d text symbols; vfs_read at %#x", checked, vfsRead)
}

func TestHostKernelBuildID(t *testing.T) {
	notes, err := os.ReadFile("/sys/kernel/notes")
	if err != nil {
		testfixture.SkipOrFail(t, "reading /sys/kernel/notes: %v", err)
	}
	got, err := KernelBuildID("")
	if err != nil {
		t.Fatal(err)
	}
	// readelf reads only ELF files, so wrap the raw notes in a note section
	// of an object file, aligned like the kernel's (4).
	as := testfixture.NeedTool(t, "as")
	dir := t.TempDir()
	raw := filepath.Join(dir, "notes")
	if err := os.WriteFile(raw, notes, 0o644); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "notes.s")
	asm := fmt.Sprintf(".section .note.kernel,\"a\",@note\n.p2align 2\n.incbin %q\n", raw)
	if err := os.WriteFile(src, []byte(asm), 0o644); err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, "notes.o")
	testfixture.Run(t, as, "-o", obj, src)
	re := regexp.MustCompile(`Build ID: ([0-9a-f]+)`)
	for _, tool := range []string{"readelf", "eu-readelf"} {
		out := testfixture.Run(t, testfixture.NeedTool(t, tool), "-n", obj)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s printed no build id:\n%s", tool, out)
		}
		if m[1] != got {
			t.Errorf("%s: build id %s, KernelBuildID %s", tool, m[1], got)
		}
	}
	rel, err := Release()
	if err != nil || rel == "" {
		t.Fatalf("Release = %q, %v", rel, err)
	}
	info, err := ReadInfo("")
	if err != nil || info.BuildID != got || info.Release != rel {
		t.Fatalf("ReadInfo = %+v, %v", info, err)
	}
	t.Logf("release %s, build id %s, %d modules with build ids", rel, got, len(info.Modules))
}

// notes builds raw note records as sysfs exposes them.
func notes(align int, recs ...buildid.Note) []byte {
	var b bytes.Buffer
	pad := func() {
		for b.Len()%align != 0 {
			b.WriteByte(0)
		}
	}
	for _, r := range recs {
		binary.Write(&b, binary.NativeEndian, [3]uint32{uint32(len(r.Name) + 1), uint32(len(r.Desc)), r.Type})
		b.WriteString(r.Name)
		b.WriteByte(0)
		pad()
		b.Write(r.Desc)
		pad()
	}
	return b.Bytes()
}

func TestBuildIDFromNotes(t *testing.T) {
	id := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4}
	for _, align := range []int{4, 8} {
		data := notes(align,
			buildid.Note{Name: "Xen", Type: 6, Desc: []byte("linux")},
			buildid.Note{Name: "Linux", Type: 0x100, Desc: []byte{1, 2, 3}},
			buildid.Note{Name: "GNU", Type: 3, Desc: id})
		got, err := buildIDFromNotes(data)
		if err != nil || got != "deadbeef01020304" {
			t.Errorf("align %d: %q %v", align, got, err)
		}
	}
	if _, err := buildIDFromNotes(notes(4, buildid.Note{Name: "Linux", Type: 3, Desc: id})); !errors.Is(err, buildid.ErrNotFound) {
		t.Errorf("no GNU note: %v", err)
	}
	if _, err := buildIDFromNotes([]byte{4, 0, 0, 0, 0xff, 0xff, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0}); !errors.Is(err, frame.ErrCorruptFile) {
		t.Errorf("overrun: %v", err)
	}
}

func TestModuleBuildIDs(t *testing.T) {
	root := t.TempDir()
	write := func(p string, b []byte) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("module/ext4/notes/.note.gnu.build-id", notes(4, buildid.Note{Name: "GNU", Type: 3, Desc: []byte{0xab, 0xcd}}))
	write("module/xfs/notes/.note.gnu.build-id", notes(4, buildid.Note{Name: "GNU", Type: 3, Desc: []byte{1}}))
	write("module/broken/notes/.note.gnu.build-id", []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	write("module/builtin/parameters/x", []byte("1\n"))
	write("module/huge/notes/.note.gnu.build-id", make([]byte, maxModuleNote+1))
	ids, err := ModuleBuildIDs(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids["ext4"] != "abcd" || ids["xfs"] != "01" {
		t.Fatalf("ids = %v", ids)
	}
	// The host: every module that has a notes file must yield an id.
	host, err := ModuleBuildIDs("")
	if err != nil {
		t.Fatal(err)
	}
	paths, _ := filepath.Glob("/sys/module/*/notes/.note.gnu.build-id")
	if len(host) != len(paths) {
		t.Errorf("%d build ids from %d note files", len(host), len(paths))
	}
	t.Logf("host: %d modules with build ids", len(host))
}

func TestLoaderRefresh(t *testing.T) {
	proc := t.TempDir()
	path := filepath.Join(proc, "kallsyms")
	core := "ffffffff81000000 T _stext\nffffffff81000100 T vfs_read\nffffffff81000200 T _etext\n"
	if err := os.WriteFile(path, []byte(core), 0o644); err != nil {
		t.Fatal(err)
	}
	l := NewLoader(proc, t.TempDir(), 10*time.Second)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	if name, _, _, ok := l.Lookup(0xffffffff81000110); !ok || name != "vfs_read" {
		t.Fatalf("core lookup = %q %v", name, ok)
	}
	// A module appears.
	if err := os.WriteFile(path, []byte(core+"ffffffffc0001000 t mod_fn\t[newmod]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Core misses never reload; module-space misses do, once per interval.
	l.Lookup(0xffffffff81000300 - 0x200 - 1)
	if _, _, _, ok := l.Lookup(0xffffffffc0001004); ok || l.Loads() != 1 {
		t.Fatalf("reloaded within the interval: loads %d", l.Loads())
	}
	now = now.Add(11 * time.Second)
	name, mod, _, ok := l.Lookup(0xffffffffc0001004)
	if !ok || name != "mod_fn" || mod != "newmod" || l.Loads() != 2 {
		t.Fatalf("after interval: %q %q %v, loads %d", name, mod, ok, l.Loads())
	}
	// A persistent miss costs one reload per interval, not one per lookup.
	for i := 0; i < 100; i++ {
		l.Lookup(0xffffffffd0000000)
	}
	if l.Loads() != 2 {
		t.Fatalf("loads %d after repeated misses", l.Loads())
	}
	// A broken file keeps the old table.
	if err := os.WriteFile(path, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("Refresh = %v", err)
	}
	if name, _, _, ok := l.Lookup(0xffffffffc0001004); !ok || name != "mod_fn" {
		t.Fatalf("old table lost: %q %v", name, ok)
	}
	if info, err := l.Info(); err != nil || info.Release == "" {
		t.Fatalf("Info = %+v %v", info, err)
	}
}

func TestLoaderHidden(t *testing.T) {
	proc := t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "kallsyms"), []byte("0000000000000000 T _stext\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := NewLoader(proc, "", time.Hour)
	for i := 0; i < 5; i++ {
		if _, err := l.Table(); !errors.Is(err, ErrAddressesHidden) {
			t.Fatalf("Table = %v", err)
		}
		l.Lookup(0xffffffff81000000)
	}
	if l.Loads() != 1 {
		t.Fatalf("%d loads of a hidden kallsyms", l.Loads())
	}
}

func BenchmarkParseKallsyms(b *testing.B) {
	data := hostKallsyms(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseKallsyms(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLookup(b *testing.B) {
	data := hostKallsyms(b)
	tab, err := ParseKallsyms(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	starts := tab.starts
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tab.Lookup(starts[i%len(starts)] + 3)
		i += 7919
	}
}

func FuzzParseKallsyms(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte("0000000000000000 T a\n"))
	if data, err := os.ReadFile("/proc/kallsyms"); err == nil {
		// Whole lines from the head of the real file and its module lines.
		// Small seeds keep the fuzzer's minimization of new inputs quick.
		var head, mods []byte
		for _, l := range bytes.SplitAfter(data, []byte("\n")) {
			if len(head)+len(l) <= 2<<10 {
				head = append(head, l...)
			}
			if bytes.IndexByte(l, '[') >= 0 && len(mods)+len(l) <= 2<<10 {
				mods = append(mods, l...)
			}
		}
		f.Add(head)
		f.Add(mods)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := ParseKallsyms(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, ErrAddressesHidden) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		for i, s := range tab.starts {
			if i > 0 && s <= tab.starts[i-1] {
				t.Fatalf("starts not strictly sorted at %d", i)
			}
			name, _, start, ok := tab.Lookup(s)
			if !ok || start != s || name == "" {
				t.Fatalf("Lookup(own start %#x) = %q %#x %v", s, name, start, ok)
			}
			if tab.sizes[i] == 0 || tab.sizes[i] > MaxSymbolSize {
				t.Fatalf("size %d", tab.sizes[i])
			}
		}
		if tab.Len() > bytes.Count(data, []byte("\n"))+1 {
			t.Fatalf("%d symbols from %d lines", tab.Len(), bytes.Count(data, []byte("\n")))
		}
	})
}

func FuzzNotes(f *testing.F) {
	f.Add(notes(4, buildid.Note{Name: "GNU", Type: 3, Desc: []byte{1, 2, 3, 4}}))
	f.Add(notes(8, buildid.Note{Name: "Linux", Type: 1, Desc: []byte{1}}, buildid.Note{Name: "GNU", Type: 3, Desc: []byte{5}}))
	if data, err := os.ReadFile("/sys/kernel/notes"); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := buildIDFromNotes(data)
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, buildid.ErrNotFound) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		if id == "" || len(id) > 2*maxBuildIDLen || len(id) > 2*len(data) {
			t.Fatalf("id %q from %d bytes", id, len(data))
		}
	})
}

// Concurrent lookups while one goroutine reloads must be race-free and
// never miss what both tables contain.
func TestLoaderConcurrent(t *testing.T) {
	proc := t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "kallsyms"), []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	l := NewLoader(proc, t.TempDir(), time.Nanosecond)
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 200; i++ {
				if name, _, _, ok := l.Lookup(0xffffffff81000180); !ok || name != "vfs_read" {
					t.Errorf("Lookup = %q %v", name, ok)
					return
				}
				l.Lookup(0xffffffffd0000000) // a module-space miss: reloads
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	t.Logf("%d loads", l.Loads())
}
