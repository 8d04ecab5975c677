package table

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/leb128"
)

// Hand-built CFI for the hostile cases. cie/fde produce .eh_frame entries
// with 4-byte absolute addresses (augmentation "zR", DW_EH_PE_udata4).

// stdCIE returns a zR CIE (udata4 addresses) with the x86-64 entry state.
func stdCIE() []byte { return cieWith("zR", []byte{peUdata4}, stdInit) }

var stdInit = []byte{cfaDefCFA, 7, 8, 0x80 | 16, 1} // CFA=rsp+8, rip at CFA-8

func cieWith(aug string, augData, instrs []byte) []byte {
	body := []byte{0, 0, 0, 0, 1}
	body = append(body, aug...)
	body = append(body, 0, 1, 0x78, 16)
	if strings.HasPrefix(aug, "z") {
		body = binary.AppendUvarint(body, uint64(len(augData)))
		body = append(body, augData...)
	}
	body = append(body, instrs...)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// fde returns an FDE at section offset pos for the CIE at cieOff.
func fde(pos, cieOff int, start, length uint32, instrs []byte) []byte {
	body := binary.LittleEndian.AppendUint32(nil, uint32(pos+4-cieOff))
	body = binary.LittleEndian.AppendUint32(body, start)
	body = binary.LittleEndian.AppendUint32(body, length)
	body = append(body, 0) // augmentation data length
	body = append(body, instrs...)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func testBuilder(maxRows int) *builder {
	return &builder{
		max: maxRows, regs: archRegs{fp: 6, sp: 7}, ptrSz: 8,
		text: [][2]uint64{{0x1000, 0x100000}},
		code: func(uint64, int) []byte { return nil },
	}
}

// parseEH runs the .eh_frame path and the merge, and checks the result's
// shape whatever the input.
func parseEH(t testing.TB, b *builder, eh []byte, ehAddr uint64, hdr []byte, hdrAddr uint64) ([]Row, error) {
	var h *ehHdr
	var herr error
	if len(hdr) > 0 {
		h, herr = parseEhHdr(hdr, hdrAddr, 8, false)
	}
	src, err := b.readEHFrame(eh, ehAddr, h, herr)
	if err != nil && !errors.Is(err, frame.ErrLimitExceeded) && src != nil {
		t.Fatalf("error %v with a source", err)
	}
	if src == nil {
		return nil, err
	}
	if len(src.segs) == 0 {
		return nil, errors.New("no usable FDE")
	}
	rows, err := b.emitAll(b.merge([]*source{src}))
	if err != nil {
		return nil, err
	}
	checkRows(t, rows)
	return rows, nil
}

func checkRows(t testing.TB, rows []Row) {
	for i := 1; i < len(rows); i++ {
		if rows[i].PC <= rows[i-1].PC || rows[i].sameRule(&rows[i-1]) {
			t.Fatalf("rows %d, %d: %+v, %+v", i-1, i, rows[i-1], rows[i])
		}
	}
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func TestHostileCFI(t *testing.T) {
	c := stdCIE()
	at := len(c)
	ok := fde(at, 0, 0x2000, 16, []byte{0x41, cfaDefCFAOffset, 16})
	// An FDE first, then damage: the rows before the damage stay.
	after := func(junk ...byte) []byte { return cat(c, ok, junk) }
	hugeAug := []byte{0, 0, 0, 0, 1, 'z', 'R', 0, 1, 0x78, 16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}
	hugeAugCIE := cat(binary.LittleEndian.AppendUint32(nil, uint32(len(hugeAug))), hugeAug)
	persCIE := cieWith("zPR", []byte{peIndirect | peUdata4, 0, 0x20, 0, 0, peUdata4}, stdInit)
	for _, tc := range []struct {
		name    string
		eh      []byte
		wantErr bool // no usable FDE at all
		bad     int  // FDEs counted as malformed
		rows    int  // -1: do not check
	}{
		{"ok", cat(c, ok), false, 0, 3},
		{"augmentation length claims an exabyte", cat(hugeAugCIE, fde(len(hugeAugCIE), 0, 0x2000, 16, nil)), true, 1, -1},
		{"entry length past the end", after(0xf0, 0xff, 0xff, 0x0f, 1, 2, 3), false, 0, 3},
		{"reserved length", after(0xf5, 0xff, 0xff, 0xff), false, 0, 3},
		{"64-bit length of 2^62", after(0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x40), false, 0, 3},
		{"FDE pointing before the section", fde(0, 0x100000, 0x2000, 16, nil), true, 0, -1},
		{"FDE pointing at an FDE", cat(c, fde(at, at, 0x2000, 16, nil)), true, 1, -1},
		{"remember_state overflow", cat(c, fde(at, 0, 0x2000, 16, bytesRepeat(cfaRememberState, 1000))), false, 1, 1},
		{"restore_state underflow", cat(c, fde(at, 0, 0x2000, 16, []byte{cfaRestoreState})), false, 1, 1},
		{"location overflow", cat(c, fde(at, 0, 0x2000, 16, []byte{cfaMIPSAdvanceLoc8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})), false, 1, 1},
		{"set_loc backwards", cat(c, fde(at, 0, 0x2000, 16, []byte{0x41, cfaSetLoc, 0, 0x10, 0, 0})), false, 1, 1},
		{"set_loc forwards", cat(c, fde(at, 0, 0x2000, 16, []byte{cfaSetLoc, 4, 0x20, 0, 0, cfaDefCFAOffset, 16})), false, 0, 3},
		{"overlong uleb", cat(c, fde(at, 0, 0x2000, 16, cat([]byte{cfaDefCFAOffset}, bytesRepeat(0x80, 11), []byte{1}))), false, 1, 1},
		{"unknown opcode", cat(c, fde(at, 0, 0x2000, 16, []byte{0x3f})), false, 1, 1},
		{"expression block past the end", cat(c, fde(at, 0, 0x2000, 16, []byte{cfaDefCFAExpression, 0xff, 0x7f})), false, 1, 1},
		{"range outside text", cat(c, fde(at, 0, 0x10, 0xffffff00, nil)), true, 0, -1},
		{"advance beyond the FDE", cat(c, fde(at, 0, 0x2000, 16, []byte{cfaAdvanceLoc4, 0, 0, 1, 0, cfaDefCFAOffset, 99})), false, 0, 2},
		{"unknown augmentation", cat(cieWith("zQ", []byte{1}, stdInit), fde(at, 0, 0x2000, 16, nil)), true, 1, -1},
		{"personality, indirect", cat(persCIE, fde(len(persCIE), 0, 0x2000, 16, nil)), false, 0, 2},
		{"CIE version 2", cat(append(c[:8:8], 2), c[9:], fde(at, 0, 0x2000, 16, nil)), true, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(1 << 16)
			rows, err := parseEH(t, b, tc.eh, 0x1000, nil, 0)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v; stats %+v", err, tc.wantErr, b.stats)
			}
			if b.stats.BadFDEs != tc.bad {
				t.Errorf("bad FDEs %d, want %d; %+v", b.stats.BadFDEs, tc.bad, b.stats)
			}
			if tc.rows >= 0 && len(rows) != tc.rows {
				t.Errorf("%d rows, want %d: %+v", len(rows), tc.rows, rows)
			}
		})
	}
}

// A CIE with code alignment 0 would make every advance a no-op: refused,
// its FDE dropped.
func TestZeroCodeAlign(t *testing.T) {
	body := []byte{0, 0, 0, 0, 1, 'z', 'R', 0, 0, 0x78, 16, 1, peUdata4}
	c := append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
	b := testBuilder(1 << 16)
	if _, err := parseEH(t, b, cat(c, fde(len(c), 0, 0x2000, 16, nil)), 0x1000, nil, 0); err == nil {
		t.Fatal("no error")
	}
	if b.stats.BadFDEs != 1 || !strings.Contains(b.stats.FirstError, "code alignment") {
		t.Fatalf("%+v", b.stats)
	}
}

func bytesRepeat(c byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return b
}

func TestHostileMaxRows(t *testing.T) {
	c := stdCIE()
	// One FDE whose program changes the CFA at every byte.
	var prog []byte
	for i := 0; i < 5000; i++ {
		prog = append(prog, 0x41, cfaDefCFAOffset, byte(8+8*(i%2)))
	}
	b := testBuilder(1000)
	_, err := parseEH(t, b, cat(c, fde(len(c), 0, 0x2000, 10000, prog)), 0x1000, nil, 0)
	if !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("got %v", err)
	}
}

// An .eh_frame_hdr that claims more FDEs than it holds is refused before
// anything is allocated for them.
func TestHostileHdrCount(t *testing.T) {
	hdr := []byte{1, pePcrel | peSdata4, peUdata4, peDatarel | peSdata4}
	hdr = binary.LittleEndian.AppendUint32(hdr, 0)
	hdr = binary.LittleEndian.AppendUint32(hdr, 0x7fffffff)
	hdr = append(hdr, make([]byte, 16)...)
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := parseEhHdr(hdr, 0x1000, 8, false); err == nil || !strings.Contains(err.Error(), "claims") {
			t.Fatalf("got %v", err)
		}
	})
	// Five: the error and fmt's own; none sized by the claim.
	limit := 5.0
	if raceEnabled {
		limit++ // fmt's printer, when the detector's sync.Pool dropped it
	}
	if allocs > limit {
		t.Fatalf("%v allocations", allocs)
	}
}

// A corrupt entry in the middle stops the walk; the header's index still
// leads to the FDEs after it.
func TestHdrRecovery(t *testing.T) {
	c := stdCIE()
	f1 := fde(len(c), 0, 0x2000, 16, nil)
	brokenAt := len(c) + len(f1)
	broken := []byte{0xf0, 0xff, 0xff, 0x7f} // length past the end: framing lost
	// The FDE the index knows sits after the damage.
	pad := make([]byte, 12)
	f2at := brokenAt + len(broken) + len(pad)
	f2 := fde(f2at, 0, 0x3000, 16, []byte{0x41, cfaDefCFAOffset, 16})
	eh := cat(c, f1, broken, pad, f2)
	const ehAddr, hdrAddr = 0x10000, 0x8000
	hdr := []byte{1, peUdata4, peUdata4, peDatarel | peSdata4}
	hdr = binary.LittleEndian.AppendUint32(hdr, ehAddr)
	hdr = binary.LittleEndian.AppendUint32(hdr, 2)
	for _, e := range [][2]int{{0x2000, len(c)}, {0x3000, f2at}} {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(e[0]-hdrAddr))
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(ehAddr+e[1]-hdrAddr))
	}
	b := testBuilder(1 << 16)
	rows, err := parseEH(t, b, eh, ehAddr, hdr, hdrAddr)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, r := range rows {
		got = append(got, r.PC)
	}
	if b.stats.FDEs != 2 || len(rows) != 5 || rows[3].PC != 0x3001 || rows[3].CFAOffset != 16 {
		t.Fatalf("rows at %#x, %+v, stats %+v", got, rows, b.stats)
	}
}

// fdeRaw returns an FDE at section offset pos with the given encoded
// address and range fields.
func fdeRaw(pos, cieOff int, addr, rng []byte, aug bool, instrs []byte) []byte {
	body := binary.LittleEndian.AppendUint32(nil, uint32(pos+4-cieOff))
	body = append(body, addr...)
	body = append(body, rng...)
	if aug {
		body = append(body, 0)
	}
	body = append(body, instrs...)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// TestPointerEncodings covers each DW_EH_PE_* form an FDE address may use.
func TestPointerEncodings(t *testing.T) {
	const ehAddr, hdrAddr, target = 0x10000, 0x8000, 0x2000
	le32 := func(v int64) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }
	le64 := func(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }
	for _, tc := range []struct {
		name string
		cie  []byte
		addr func(fieldAddr int64) []byte // the encoded address field
		rng  []byte
		aug  bool
	}{
		{"udata4", cieWith("zR", []byte{peUdata4}, stdInit), func(int64) []byte { return le32(target) }, le32(16), true},
		{"pcrel sdata4", cieWith("zR", []byte{pePcrel | peSdata4}, stdInit), func(a int64) []byte { return le32(target - a) }, le32(16), true},
		{"datarel sdata4", cieWith("zR", []byte{peDatarel | peSdata4}, stdInit), func(int64) []byte { return le32(target - hdrAddr) }, le32(16), true},
		{"udata8", cieWith("zR", []byte{peUdata8}, stdInit), func(int64) []byte { return le64(target) }, le64(16), true},
		{"sdata8 pcrel", cieWith("zR", []byte{pePcrel | peSdata8}, stdInit), func(a int64) []byte { return le64(target - a) }, le64(16), true},
		{"udata2", cieWith("zR", []byte{peUdata2}, stdInit), func(int64) []byte { return []byte{0x00, 0x20} }, []byte{16, 0}, true},
		{"uleb128", cieWith("zR", []byte{peUleb128}, stdInit), func(int64) []byte { return binary.AppendUvarint(nil, target) }, []byte{16}, true},
		{"sleb128 pcrel", cieWith("zR", []byte{pePcrel | peSleb128}, stdInit), func(a int64) []byte { return leb128.AppendInt(nil, target-a) }, []byte{16}, true},
		{"aligned absptr", cieWith("zR", []byte{peAligned}, stdInit), func(a int64) []byte {
			pad := (8 - a%8) % 8
			return append(make([]byte, pad), le64(target)...)
		}, le64(16), true},
		{"indirect udata4", cieWith("zR", []byte{peIndirect | peUdata4}, stdInit), func(int64) []byte { return le32(0x5000) }, le32(16), true},
		{"legacy eh", cieWith("eh\x00\x00\x00\x00\x00\x00\x00\x00", nil, stdInit), func(int64) []byte { return le64(target) }, le64(16), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cie
			pos := len(c)
			fieldAddr := int64(ehAddr + pos + 8) // after the length and CIE pointer
			eh := cat(c, fdeRaw(pos, 0, tc.addr(fieldAddr), tc.rng, tc.aug, []byte{0x41, cfaDefCFAOffset, 16}))
			hdr := []byte{1, peUdata4, peOmit, peOmit}
			hdr = binary.LittleEndian.AppendUint32(hdr, ehAddr)
			b := testBuilder(1 << 16)
			b.code = func(addr uint64, n int) []byte {
				if addr == 0x5000 && n == 8 {
					return le64(target)
				}
				return nil
			}
			rows, err := parseEH(t, b, eh, ehAddr, hdr, hdrAddr)
			if err != nil {
				t.Fatalf("%v; stats %+v", err, b.stats)
			}
			if len(rows) != 3 || rows[0].PC != target || rows[1].PC != target+1 || rows[1].CFAOffset != 16 || rows[2].PC != target+16 {
				t.Fatalf("rows %+v; stats %+v", rows, b.stats)
			}
		})
	}
}

// TestOverlapPriority: where .eh_frame and .debug_frame describe the same
// addresses, .eh_frame wins, and .debug_frame's rows resume after it with
// the rule in force there.
func TestOverlapPriority(t *testing.T) {
	// .debug_frame: CIE id ~0, absolute 8-byte addresses.
	cieBody := []byte{0xff, 0xff, 0xff, 0xff, 1, 0, 1, 0x78, 16}
	cieBody = append(cieBody, stdInit...)
	df := cat(binary.LittleEndian.AppendUint32(nil, uint32(len(cieBody))), cieBody)
	fdeBody := binary.LittleEndian.AppendUint32(nil, 0) // CIE at offset 0
	fdeBody = binary.LittleEndian.AppendUint64(fdeBody, 0x2000)
	fdeBody = binary.LittleEndian.AppendUint64(fdeBody, 0x30)
	fdeBody = append(fdeBody, 0x44, cfaDefCFAOffset, 16, 0x40|0x14, cfaDefCFAOffset, 24, 0x50, cfaDefCFAOffset, 32)
	df = cat(df, binary.LittleEndian.AppendUint32(nil, uint32(len(fdeBody))), fdeBody)

	c := stdCIE()
	eh := cat(c, fde(len(c), 0, 0x2010, 0x10, []byte{cfaDefCFA, 6, 16}))

	b := testBuilder(1 << 16)
	ehSrc, err := b.readEHFrame(eh, 0x1000, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dfSrc, err := b.readDebugFrame(df)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := b.emitAll(b.merge([]*source{ehSrc, dfSrc}))
	if err != nil {
		t.Fatal(err)
	}
	sp := func(pc uint64, off int32) Row {
		return Row{PC: pc, Kind: KindNormal, CFA: CFASP, CFAOffset: off, RAOffset: -8}
	}
	want := []Row{
		sp(0x2000, 8), sp(0x2004, 16),
		{PC: 0x2010, Kind: KindNormal, CFA: CFAFP, CFAOffset: 16, RAOffset: -8},
		sp(0x2020, 24), sp(0x2028, 32),
		{PC: 0x2030, Kind: KindFallback},
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", rows, want)
	}
}

// TestHostileFDEFlood: FDEs whose CIE pointers all lead somewhere different
// and wrong. Each costs its entry; the CIE cache stays bounded; the row
// limit also bounds how many FDEs are read at all.
func TestHostileFDEFlood(t *testing.T) {
	const n = 100_000
	eh := stdCIE()
	for i := 0; i < n; i++ {
		// Point at the FDE before (or the CIE's middle for the first).
		prev := len(eh) - 20
		eh = append(eh, fde(len(eh), prev, 0x2000, 16, nil)...)
	}
	b := testBuilder(DefaultMaxRows)
	if _, err := parseEH(t, b, eh, 0x1000, nil, 0); err == nil {
		t.Fatal("no error")
	}
	if b.stats.BadFDEs != n {
		t.Fatalf("%+v", b.stats)
	}
	b = testBuilder(1000)
	if _, err := parseEH(t, b, eh, 0x1000, nil, 0); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Fatalf("got %v", err)
	}
}

// emitAll is emit into a slice.
func (b *builder) emitAll(pieces []piece) ([]Row, error) {
	var rows []Row
	_, err := b.emit(pieces, func(batch []Row) error {
		rows = append(rows, batch...)
		return nil
	})
	return rows, err
}
