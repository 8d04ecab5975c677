package demangle

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os/exec"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// TestRustV0Residuals: the two names the library got wrong, as
// llvm-cxxfilt-19 and c++filt (less the crate hash) spell them: nested
// closures innermost first, and a unit generic argument kept.
func TestRustV0Residuals(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"_RNCNCNCNvNtCsjrHSEGnQ3l9_3std2rt19lang_start_internal00s_0B9_",
			"std::rt::lang_start_internal::{closure#0}::{closure#0}::{closure#1}"},
		{"_RNCINvNtNtCsjrHSEGnQ3l9_3std6thread7current17with_current_nameNCNCNvNtB8_9panicking12default_hook00uE0B8_",
			"std::thread::current::with_current_name::<std::panicking::default_hook::{closure#0}::{closure#0}, ()>::{closure#0}"},
		// A suffix, and a punycode identifier, as llvm-cxxfilt-19 prints them.
		{"_RNvCs1234_4main4main.llvm.123", "main::main (.llvm.123)"},
		{"_RNvNvCs1234_4main2fnu7ab_gmad", "main::fn::ďĎab"},
		// Malformed: left as is.
		{"_RNvNtCs1234_4main7ubb_bdd", "_RNvNtCs1234_4main7ubb_bdd"},
	} {
		if got := Name(c.in); got != c.want {
			t.Errorf("Name(%q)\n\t= %q\n\twant %q", c.in, got, c.want)
		}
	}
}

// TestRustV0MatchesLLVM demangles every v0 symbol of the project's Rust
// fixture and of its standard library as llvm-cxxfilt-19 does.
func TestRustV0MatchesLLVM(t *testing.T) {
	cxxfilt := testfixture.NeedTool(t, "llvm-cxxfilt-19")
	bin := testfixture.Build(t, testfixture.Spec{Name: "rust-v0", Lang: "rust", Sources: []string{"engine/rust/main.rs"},
		Args: []string{"-g", "-C", "opt-level=2", "-C", "symbol-mangling-version=v0"}})
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	f.Close()
	var names []string
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "_R") {
			names = append(names, s.Name)
		}
	}
	if len(names) < 100 {
		t.Fatalf("%d v0 symbols in %s", len(names), bin)
	}
	cmd := exec.Command(cxxfilt)
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	bad := 0
	for i := 0; sc.Scan(); i++ {
		if got := Name(names[i]); got != sc.Text() {
			if bad++; bad <= 5 {
				t.Errorf("Name(%q)\n\t= %q\n\tllvm-cxxfilt-19 %q", names[i], got, sc.Text())
			}
		}
	}
	t.Logf("%d v0 names, %d differ from llvm-cxxfilt-19", len(names), bad)
}

// FuzzRustV0: any input demangles or is refused, within the output bound.
func FuzzRustV0(f *testing.F) {
	for _, s := range []string{"_RNCNCNCNvNtCsjrHSEGnQ3l9_3std2rt19lang_start_internal00s_0B9_", "_RNvCs1234_4main4main",
		"_RNCINvNtNtCsjrHSEGnQ3l9_3std6thread7current17with_current_nameNCNCNvNtB8_9panicking12default_hook00uE0B8_",
		"_RYFG0_RL0_ReEB0_", "_RINvC1a1fKc1f600_E", "_RNvNvCs1234_4main2fnu7ab_gmad"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := RustV0(s); ok && len(d) > maxV0Output+len(s)+3 {
			t.Fatalf("%d bytes of output", len(d))
		}
	})
}

// v0Synthetic covers what the fixture's symbols do not: every type form,
// consts of each kind, binders and lifetimes, dyn traits with associated
// types, shims and other special namespaces, malformed input.
var v0Synthetic = []string{
	"_RYFG0_RL0_ReEB0_", "_RINvC1a1fKc1f600_E", "_RINvC1a1fKbn1_E", "_RNvC1a1f",
	"_RINvCs1234_4main1fAhj5_E", "_RINvCs1234_4main1fFUKCmEuE", "_RINvCs1234_4main1fDNtC3std4SendEL_E",
	"_RINvC1a1fKb1_KbO_Kan2a_Kp Kc27_E", "_RINvC1a1fKan2a_KhFF_KyFFFFFFFFFFFFFFFFF_Kc27_Kc5c_Kca_E",
	"_RINvC1a1fTEThETjmEE", "_RINvC1a1fRhQhPhOhRL_hE", "_RINvC1a1fFG0_RL0_hEuE", "_RINvC1a1fFG1_RL1_RL0_hEhE",
	"_RINvC1a1fFKs3foo_barEuE", "_RINvC1a1fDG0_INtC1a1TRL0_hEp4Item4bool EL0_E", "_RINvC1a1fDINtC1a1TpC4ItemhEL_E",
	"_RNSNvC1a1f5shim_", "_RNCNvC1a1fs0_0", "_RNXNvC1a1fs_0", "_RMCs1234_4mainINtB2_1ShE",
	"_RXNvC1a1fhNtC1a5Trait", "_RNvYhNtC1a5Trait3foo", "_RINvC1a1fSSSSSSSSSSSSSSSSShE",
	"_RINvC1a1fB0_E", "_RNvB0_1f", "_RNvC1a1fB5_", "_RINvC1a1fKnffffffffffffffffffffffffffffffff_E",
	"_RNvC1a1f.llvm.9.cold", "_RNvCu6mdcq1x1f", "_RNvC1aU1f", "_RNvC1a1fLL", "_RNvC1a", "_R", "_RC",
}

// TestRustV0Synthetic compares v0Synthetic with llvm-cxxfilt-19.
func TestRustV0Synthetic(t *testing.T) {
	cxxfilt := testfixture.NeedTool(t, "llvm-cxxfilt-19")
	for _, s := range v0Synthetic {
		out, err := exec.Command(cxxfilt, s).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := Name(s), strings.TrimSuffix(string(out), "\n"); got != want {
			t.Errorf("Name(%q)\n\t= %q\n\tllvm-cxxfilt-19 %q", s, got, want)
		}
	}
}
