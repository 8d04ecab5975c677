package testfixture

import (
	"debug/elf"
	"encoding/hex"
	"testing"
)

// Func returns the ELF virtual address and size of the function symbol name
// in bin, failing the test when there is none.
func Func(t testing.TB, bin, name string) (start, size uint64) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	for _, s := range syms {
		if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			return s.Value, s.Size
		}
	}
	t.Fatalf("%s: no function %s", bin, name)
	return 0, 0
}

// BuildID returns bin's GNU build id in hex, failing the test when absent.
func BuildID(t testing.TB, bin string) string {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatalf("%s has no build id", bin)
	}
	b, err := s.Data()
	if err != nil || len(b) <= 16 {
		t.Fatalf("%s: bad build-id note", bin)
	}
	return hex.EncodeToString(b[16:]) // namesz, descsz, type, "GNU\0", id
}
