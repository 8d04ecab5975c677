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
		tab, err := newTable(s)
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
					fr, err = tab.Lookup(pc, inl, fr[:0])
					if err != nil && !errors.Is(err, frame.ErrCorruptFile) {
						t.Fatalf("Lookup: unclassified error %v", err)
					}
				}
			}
		}
		tab.SizeBytes()
	})
}
