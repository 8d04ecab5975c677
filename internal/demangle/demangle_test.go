package demangle

import "testing"

func TestName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"main", "main"},
		{"main.main", "main.main"},
		{"_ZN12_GLOBAL__N_14anonEi.constprop.0", "(anonymous namespace)::anon(int) (.constprop.0)"},
		{"_ZZN12_GLOBAL__N_14anonEiENKUliE_clEi", "(anonymous namespace)::anon(int)::'lambda'(int)::operator()(int) const"},
		{"_ZNSt6vectorIiSaIiEE9push_backEOi", "std::vector<int, std::allocator<int>>::push_back(int&&)"},
		{"_ZN1r5inner10S$LT$T$GT$4show17h79de9c7de3d0d1b4E", "r::inner::S<T>::show"},
		{"_RNvMNtCs6GmmlP4bgsG_1r5innerINtB2_1SINtNtCslNYArtu3iFV_5alloc3vec3VechEE4showB4_", "<r::inner::S<alloc::vec::Vec<u8>>>::show"},
		{"_Znotmangled!", "_Znotmangled!"},
	} {
		var c Cache
		if got := c.Name(tc.in); got != tc.want {
			t.Errorf("Name(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzName(f *testing.F) {
	for _, s := range []string{"_ZN3foo3barEi", "_RNvCs1234_4main4main", "_ZN1r5inner10S$LT$T$GT$4show17h79de9c7de3d0d1b4E"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { _ = Name(s) })
}
