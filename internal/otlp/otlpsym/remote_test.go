package otlpsym

import "testing"

func TestParseRemote(t *testing.T) {
	for _, tc := range []struct {
		name, system, file string
		id                 string
		off                uint64
		ok                 bool
	}{
		{"<remote>", "deadbeef1234567890abcdef", "0x1a2b", "deadbeef1234567890abcdef", 0x1a2b, true},
		{"deadbeef1234567890abcdef.<remote>", "", "(0x1234)", "deadbeef1234567890abcdef", 0x1234, true},
		{"<remote>", "(0x10)", "DEADBEEF12345678", "deadbeef12345678", 0x10, true},
		{"<remote>", "not-hex", "0x10", "", 0, false},
		{"<remote>", "deadbeef12345678", "12", "", 0, false},
		{"main", "deadbeef12345678", "0x10", "", 0, false},
		{"<remote>", "deadbeef12345678", "0x1ffffffffffffffff", "", 0, false},
	} {
		id, off, ok := parseRemote(tc.name, tc.system, tc.file)
		if ok != tc.ok || id != tc.id || off != tc.off {
			t.Errorf("parseRemote(%q,%q,%q) = %q,%#x,%v; want %q,%#x,%v", tc.name, tc.system, tc.file, id, off, ok, tc.id, tc.off, tc.ok)
		}
	}
}

func FuzzParseRemote(f *testing.F) {
	f.Add("<remote>", "deadbeef1234567890abcdef", "0x1a2b")
	f.Add("deadbeef1234567890abcdef.<remote>", "", "(0x1234)")
	f.Fuzz(func(t *testing.T, name, system, file string) {
		id, _, ok := parseRemote(name, system, file)
		if ok && !isHexID(id) {
			t.Fatalf("accepted non-hex id %q", id)
		}
	})
}
