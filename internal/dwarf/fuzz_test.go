package dwarf

import (
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// fuzzSections lists the sections a fuzz input may replace.
var fuzzSections = []string{".debug_info", ".debug_abbrev", ".debug_line", ".debug_ranges",
	".debug_rnglists", ".debug_aranges", ".debug_str_offsets", ".debug_addr", ".debug_line_str"}

func sectionPtr(s *sections, i int) *[]byte {
	return [...]*[]byte{&s.info, &s.abbrev, &s.line, &s.ranges, &s.rnglists, &s.aranges, &s.strOffsets, &s.addr, &s.lineStr}[i]
}

func loadSections(tb testing.TB, path string) sections {
	f, err := elfx.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	var s sections
	for i, name := range append(fuzzSections, ".debug_str") {
		d, err := f.SectionData(name)
		if err != nil && !errors.Is(err, elfx.ErrNoSection) {
			tb.Fatal(err)
		}
		// Copy: the fuzzer outlives nothing, but seeds must not alias the
		// mapping that Cleanup unmaps.
		d = append([]byte(nil), d...)
		if i < len(fuzzSections) {
			*sectionPtr(&s, i) = d
		} else {
			s.str = d
		}
	}
	return s
}

// FuzzLookup replaces one DWARF section of a real fixture with the fuzz
// input, then indexes and looks up addresses across every unit. Neither
// may panic or hang; errors must wrap frame.ErrCorruptFile or
// frame.ErrNoDebugInfo.
func FuzzLookup(f *testing.F) {
	tiny := func(v string) string {
		return testfixture.Build(f, testfixture.Spec{Name: "tiny" + v, Lang: "c", Sources: []string{"dwarf/tiny/tiny.c"},
			Args: []string{"-O2", v, "-shared", "-nostdlib", "-fPIC"}})
	}
	bases := []sections{
		loadSections(f, tiny("-gdwarf-4")),
		loadSections(f, tiny("-gdwarf-5")),
		loadSections(f, cFixture(f, "c-O2-gdwarf-5", "-O2", "-gdwarf-5").path),
	}
	for bi, base := range bases {
		for i := range fuzzSections {
			if d := *sectionPtr(&base, i); len(d) > 0 {
				f.Add(uint8(bi), uint8(i), d)
			}
		}
	}
	f.Cleanup(contain.Off())
	f.Fuzz(func(t *testing.T, which, sec uint8, data []byte) {
		s := bases[int(which)%len(bases)]
		*sectionPtr(&s, int(sec)%len(fuzzSections)) = data
		tab, err := newTable(s, Extra{}, nil)
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, frame.ErrNoDebugInfo) {
				t.Fatalf("newTable: unclassified error %v", err)
			}
			return
		}
		var fr []frame.Frame
		for i, r := range tab.index {
			if i == 64 {
				break
			}
			for _, pc := range []uint64{r.lo, r.lo + (r.hi-r.lo)/2, r.hi - 1} {
				for _, inl := range []bool{true, false} {
					fr, _, err = tab.Lookup(pc, inl, fr[:0])
					if err != nil && !errors.Is(err, frame.ErrCorruptFile) {
						t.Fatalf("Lookup: unclassified error %v", err)
					}
				}
			}
		}
		tab.SizeBytes()
	})
}

// FuzzSupLink holds the .gnu_debugaltlink and .debug_sup parsers to their
// bounds: no panic, and a link they accept has a name and a build id of a
// sane length.
func FuzzSupLink(f *testing.F) {
	f.Add([]byte("/usr/lib/debug/.dwz/x86_64-linux-gnu/libc6.debug\x00\x7b\x1d\x67\x90\xac\xa4\xd6\x72\xbb\xa5\xb0\xd7\x22\x3c\x8b\x87\xd9\xf5\xdf\x10"))
	f.Add([]byte("\x05\x00\x00common.debug\x00\x14\x7b\x1d\x67\x90\xac\xa4\xd6\x72\xbb\xa5\xb0\xd7\x22\x3c\x8b\x87\xd9\xf5\xdf\x10"))
	f.Add([]byte("\x05\x00\x01\x00\x00"))
	check := func(t *testing.T, l SupLink) {
		if l.Name == "" || len(l.Name) > maxSupName || len(l.BuildID) < frame.MinBuildIDBytes || len(l.BuildID) > frame.MaxBuildIDBytes {
			t.Fatalf("accepted %+v", l)
		}
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		if l, err := ParseAltLink(d); err == nil {
			check(t, l)
		}
		if l, isSup, err := ParseDebugSup(d); err == nil && !isSup {
			check(t, l)
		}
	})
}

// FuzzCUIndex holds the .debug_cu_index reader to its bounds: any bytes
// parse or fail cleanly, and every contribution handed out lies inside
// its section.
func FuzzCUIndex(f *testing.F) {
	f.Add(cuIndexBytes(5, []uint64{0xbe867d38fd2dd6d0}, []uint32{sectInfo, sectAbbrev, sectStrOffsets, sectRnglists}, 64), uint64(1))
	f.Add(cuIndexBytes(2, []uint64{1, 2, 3}, []uint32{sectInfo, sectAbbrev, sectLine, sectStrOffsets}, 32), uint64(2))
	all := SplitSections{Info: make([]byte, 100), Abbrev: make([]byte, 50), Line: make([]byte, 10),
		StrOffsets: make([]byte, 40), Rnglists: make([]byte, 30)}
	f.Fuzz(func(t *testing.T, idx []byte, id uint64) {
		ix, err := parseCUIndex(idx)
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		d := &DWP{all: all, index: ix}
		for _, probe := range []uint64{id, 0xbe867d38fd2dd6d0, 1, 2, 3} {
			ss, err := d.Sections(probe)
			if err != nil {
				continue
			}
			for _, p := range []struct{ got, in []byte }{{ss.Info, all.Info}, {ss.Abbrev, all.Abbrev},
				{ss.Line, all.Line}, {ss.StrOffsets, all.StrOffsets}, {ss.Rnglists, all.Rnglists}} {
				if len(p.got) > len(p.in) {
					t.Fatalf("contribution of %d bytes from a %d-byte section", len(p.got), len(p.in))
				}
			}
		}
	})
}

// cuIndexBytes lays out a unit index: ids in a hash table of slots, each
// unit's contributions of size 8 at offset 8*row in every kind.
func cuIndexBytes(version uint32, ids []uint64, kinds []uint32, slots uint32) []byte {
	var b []byte
	u32 := func(v uint32) { b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	if version == 5 {
		b = append(b, 5, 0, 0, 0)
	} else {
		u32(version)
	}
	u32(uint32(len(kinds)))
	u32(uint32(len(ids)))
	u32(slots)
	sigs := make([]uint64, slots)
	rows := make([]uint32, slots)
	for i, id := range ids {
		mask := uint64(slots - 1)
		h, step := id&mask, (id>>32)&mask|1
		for rows[h] != 0 {
			h = (h + step) & mask
		}
		sigs[h], rows[h] = id, uint32(i+1)
	}
	for _, s := range sigs {
		u32(uint32(s))
		u32(uint32(s >> 32))
	}
	for _, r := range rows {
		u32(r)
	}
	for _, k := range kinds {
		u32(k)
	}
	for i := range ids {
		for range kinds {
			u32(uint32(8 * i))
		}
	}
	for range ids {
		for range kinds {
			u32(8)
		}
	}
	return b
}
