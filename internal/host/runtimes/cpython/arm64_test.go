package cpython

import (
	"encoding/binary"
	"os"
	"slices"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// The arm64 branches that leave the eval loop, decoded from their
// encodings: B, B.cond, CBZ/CBNZ and TBZ/TBNZ, backwards and forwards; BL
// (a call) and the branches that stay inside are not jumps out.
func TestExternalBranchesARM64(t *testing.T) {
	const lo, hi = 0x10000, 0x10020
	code := []uint32{
		0x14000000 | 0x100,          // b lo+0x400
		0x17fffff0,                  // b lo+4-0x40: backwards, before lo
		0x54000000 | 0x100<<5 | 0x1, // b.ne pc+0x400
		0xb4000000 | 0x7ffff<<5,     // cbz x0, pc-4: inside
		0x36000000 | 0x2000<<5,      // tbz w0, #0, pc-0x8000
		0x94000100,                  // bl pc+0x400: a call
		0x14000001,                  // b pc+4: inside
		0xd503201f,                  // nop
	}
	b := make([]byte, 4*len(code))
	for i, in := range code {
		binary.LittleEndian.PutUint32(b[4*i:], in)
	}
	got := externalBranchesARM64(b, lo, hi)
	want := []uint64{lo + 0x400, lo + 4 - 0x40, lo + 8 + 0x400, lo + 16 - 0x8000}
	if !slices.Equal(got, want) {
		t.Fatalf("targets %#x, want %#x", got, want)
	}
}

// sizeofPthread reads struct pthread's size from glibc's nptl_db
// description: bookworm's arm64 glibc (libc6-arm64-cross, what
// gcc-aarch64-linux-gnu brings) says 1,856 bytes.
func TestSizeofPthread(t *testing.T) {
	const lib = "/usr/aarch64-linux-gnu/lib/libc.so.6"
	if _, err := os.Stat(lib); err != nil {
		testfixture.SkipOrFail(t, "no arm64 glibc (libc6-arm64-cross): %v", err)
	}
	f, err := elfx.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := sizeofPthread(f, lib)
	if err != nil || v != 1856 {
		t.Fatalf("sizeofPthread = %d, %v; want 1856", v, err)
	}
}
