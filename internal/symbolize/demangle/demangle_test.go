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
		// Empty pack and operator< with template arguments, as llvm-cxxfilt-19 prints them.
		{"_ZSt12__get_helperILm1ESt14default_deleteIiEJEERT0_RSt11_Tuple_implIXT_EJS2_DpT1_EE", "std::default_delete<int>& std::__get_helper<1ul, std::default_delete<int>>(std::_Tuple_impl<1ul, std::default_delete<int>>&)"},
		{"_ZStltIcSt11char_traitsIcESaIcEEbRKNSt7__cxx1112basic_stringIT_T0_T1_EESA_", "bool std::operator<<char, std::char_traits<char>, std::allocator<char>>(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char>> const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char>> const&)"},
		// An expanded pack inside a template argument expression, checked
		// against llvm-cxxfilt-19 and c++filt.
		{"_ZSt10__invoke_rIiRZ4workiEUliE1_JiEENSt9enable_ifIX16is_invocable_r_vIT_T0_DpT1_EES3_E4typeEOS4_DpOS5_",
			"std::enable_if<is_invocable_r_v<int, work(int)::'lambda1'(int)&, int>, int>::type std::__invoke_r<int, work(int)::'lambda1'(int)&, int>(work(int)::'lambda1'(int)&, int&&)"},
	} {
		c := NewCache(0, 0)
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
