package symupload

import (
	"os"
	"path/filepath"

	"github.com/profsym/profsym/internal/dwarf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
)

// A binary built with -gsplit-dwarf keeps only skeleton units: its
// functions are in .dwo files (or a .dwp package) on this host. What the
// agent uploads must name functions on the gateway, which has neither, so
// the split units go into the uploaded file itself, as the sections of a
// package (.debug_*.dwo and .debug_cu_index): the engine reads a file that
// carries them as its own package.

// splitSections returns the package sections to append to the upload of
// src (opened as f), or none when f has no skeleton units or their split
// units are not on this host (the upload then names functions as
// llvm-symbolizer does without them: lines, and symbol-table names).
func splitSections(src Source, f *elfx.File) []keepdebug.Section {
	skels, err := dwarf.Skeletons(f)
	if err != nil || len(skels) == 0 {
		return nil
	}
	// A package beside the binary (or its debug file) is taken whole.
	for _, p := range []string{src.Binary + ".dwp", src.Path + ".dwp"} {
		if secs := packageSections(p); secs != nil {
			return secs
		}
	}
	// Otherwise each skeleton's .dwo, where the compiler wrote it or
	// beside the binary, packed here. A file that is not the unit the
	// skeleton names is left out (the engine checks dwo ids too).
	var units []dwarf.SplitSections
	var open []*elfx.File
	defer func() {
		for _, o := range open {
			o.Close()
		}
	}()
	seen := map[string]bool{}
	for _, sk := range skels {
		for _, p := range dwoCandidates(src.Binary, sk) {
			if seen[p] {
				break
			}
			st, err := os.Stat(p)
			if err != nil || !st.Mode().IsRegular() {
				continue
			}
			df, err := elfx.Open(p)
			if err != nil {
				continue
			}
			ss, err := dwarf.DWOSections(df)
			if err != nil {
				df.Close()
				continue
			}
			seen[p] = true
			open = append(open, df)
			units = append(units, ss)
			break
		}
	}
	if len(units) == 0 {
		return nil
	}
	packed, err := dwarf.Pack(units)
	if err != nil {
		return nil
	}
	return sortedSections(packed)
}

// dwoCandidates: DW_AT_comp_dir/DW_AT_dwo_name, then the name and its base
// name beside the binary. These are paths on this host that the binary
// running here names; only a regular ELF file with split units is read.
func dwoCandidates(bin string, sk dwarf.Skeleton) []string {
	var out []string
	switch {
	case filepath.IsAbs(sk.DWOName):
		out = append(out, filepath.Clean(sk.DWOName))
	case filepath.IsAbs(sk.CompDir):
		out = append(out, filepath.Join(sk.CompDir, sk.DWOName))
	}
	dir := filepath.Dir(bin)
	if !filepath.IsAbs(sk.DWOName) {
		out = append(out, filepath.Join(dir, sk.DWOName))
	}
	return append(out, filepath.Join(dir, filepath.Base(sk.DWOName)))
}

// packageSections reads the sections of a .dwp at p, or nil.
func packageSections(p string) []keepdebug.Section {
	st, err := os.Stat(p)
	if err != nil || !st.Mode().IsRegular() {
		return nil
	}
	f, err := elfx.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := dwarf.OpenDWP(f); err != nil {
		return nil
	}
	m := map[string][]byte{}
	for _, name := range []string{".debug_info.dwo", ".debug_abbrev.dwo", ".debug_line.dwo", ".debug_str.dwo",
		".debug_str_offsets.dwo", ".debug_rnglists.dwo", ".debug_cu_index"} {
		if d, err := f.SectionData(name); err == nil {
			m[name] = append([]byte(nil), d...) // the file closes before the upload is written
		}
	}
	return sortedSections(m)
}

func sortedSections(m map[string][]byte) []keepdebug.Section {
	var out []keepdebug.Section
	for _, name := range []string{".debug_info.dwo", ".debug_abbrev.dwo", ".debug_line.dwo", ".debug_str.dwo",
		".debug_str_offsets.dwo", ".debug_rnglists.dwo", ".debug_cu_index"} {
		if d, ok := m[name]; ok {
			out = append(out, keepdebug.Section{Name: name, Data: d})
		}
	}
	return out
}
