package testfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// DWZSet is programs rewritten by `dwz -m`, as distributions ship their
// debug files: each copy points into one common file for the DWARF the
// programs share.
type DWZSet struct {
	Orig   []string // the programs as built
	Bins   []string // their dwz'd copies, in one folder with Common
	Common string   // the common file
	// Recorded is the common file's name as the copies record it
	// (.gnu_debugaltlink, or .debug_sup with dwz -5).
	Recorded string
}

// DWZ builds every spec, then runs `dwz -m COMMON -M recorded dwzArgs...`
// over copies of them, once per content. COMMON, beside the copies, has
// recorded's base name.
func DWZ(t testing.TB, name string, specs []Spec, recorded string, dwzArgs ...string) DWZSet {
	t.Helper()
	dwz := NeedTool(t, "dwz")
	set := DWZSet{Recorded: recorded}
	key := sha256.New()
	for _, s := range specs {
		p := Build(t, s) // its path names its content
		set.Orig = append(set.Orig, p)
		fmt.Fprintf(key, "%s\x00", p)
	}
	ver, _ := exec.Command(dwz, "--version").CombinedOutput()
	fmt.Fprintf(key, "%q\x00%q\x00%s", recorded, dwzArgs, ver)
	dir := Cached(t, hex.EncodeToString(key.Sum(nil))[:20], name, func(tmp string) {
		out := filepath.Join(tmp, name)
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		args := append(append([]string{}, dwzArgs...), "-m", filepath.Join(out, filepath.Base(recorded)), "-M", recorded)
		for _, p := range set.Orig {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			cp := filepath.Join(out, filepath.Base(p))
			if err := os.WriteFile(cp, b, 0o755); err != nil {
				t.Fatal(err)
			}
			args = append(args, cp)
		}
		Run(t, dwz, args...)
	})
	for _, p := range set.Orig {
		set.Bins = append(set.Bins, filepath.Join(dir, filepath.Base(p)))
	}
	set.Common = filepath.Join(dir, filepath.Base(recorded))
	return set
}

var supRef = regexp.MustCompile(`DW_AT_(abstract_origin|specification) \[DW_FORM_(GNU_ref_alt|ref_sup4|ref_sup8)\]`)

// SupRefs counts the DW_AT_abstract_origin and DW_AT_specification
// attributes of bin that point into its supplementary file (forms
// DW_FORM_GNU_ref_alt, DW_FORM_ref_sup4/8, as llvm-dwarfdump-19 -v prints
// them): the names of those DIEs live only there.
func SupRefs(t testing.TB, bin string) int {
	t.Helper()
	out, _ := exec.Command(NeedTool(t, "llvm-dwarfdump-19"), "-v", "--debug-info", bin).Output()
	return len(supRef.FindAll(out, -1))
}

var inlineName = regexp.MustCompile(`DW_AT_inline\s*:`)

// InlineDecls counts the abstract instances of inline functions (DIEs
// with DW_AT_inline) that `readelf -wi` shows in a file.
func InlineDecls(t testing.TB, file string) int {
	t.Helper()
	out, _ := exec.Command(NeedTool(t, "readelf"), "-wi", file).Output()
	return len(inlineName.FindAll(out, -1))
}
