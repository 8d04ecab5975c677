package elfx

import "testing"

// FuzzEHFrame: the .eh_frame_hdr table and the FDE/CIE reads that bound
// a function stripped of its symbol (CPython's and PHP's cold parts, Ruby's
// VM loop), over bytes from a file: no panic, and a range found holds the
// address asked for.
func FuzzEHFrame(f *testing.F) {
	hdr := []byte{1, 0x1b, 0x03, 0x3b, 0x10, 0, 0, 0, 1, 0, 0, 0, 0xf0, 0xff, 0xff, 0xff, 0x20, 0, 0, 0}
	cie := []byte{0x14, 0, 0, 0, 0, 0, 0, 0, 1, 'z', 'R', 0, 1, 0x78, 0x10, 1, 0x1b, 0, 0, 0, 0, 0, 0, 0}
	fde := []byte{0x14, 0, 0, 0, 0x1c, 0, 0, 0, 0xd8, 0xff, 0xff, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	f.Add(hdr, append(cie, fde...), uint64(0x1000), uint64(0x1010))
	f.Fuzz(func(t *testing.T, hdr, eh []byte, ehAddr, pc uint64) {
		x, err := ParseFDEs(hdr, ehAddr-0x100, eh, ehAddr)
		if err != nil {
			return
		}
		if s, e, ok := x.Covering(pc); ok && (pc < s || pc >= e) {
			t.Fatalf("range [%#x,%#x) does not hold %#x", s, e, pc)
		}
	})
}
