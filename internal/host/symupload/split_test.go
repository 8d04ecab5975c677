package symupload

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestSplitDWARFUpload: what the agent uploads for a -gsplit-dwarf binary
// names its functions and inlined calls on a gateway that has neither the
// binary nor its .dwo or .dwp files, as llvm-symbolizer-19 does on the
// host that has them all.
func TestSplitDWARFUpload(t *testing.T) {
	for _, s := range []testfixture.SplitSpec{
		{Name: "upload-split-gcc-dwarf4", Compiler: "g++", Args: []string{"-O2", "-gdwarf-4", "-std=c++17"}},
		{Name: "upload-split-gcc-dwarf5", Compiler: "g++", Args: []string{"-O2", "-gdwarf-5", "-std=c++17"}},
		{Name: "upload-split-clang-dwarf5-dwp", Compiler: "clang++-19", Args: []string{"-O2", "-gdwarf-5", "-std=c++17"}, Packer: "llvm-dwp-19"},
	} {
		t.Run(s.Name, func(t *testing.T) {
			s.Sources = []string{"engine/cpp/main.cc"}
			bin := testfixture.SplitDWARF(t, s)
			u := newUploader(t, "http://127.0.0.1:1", &counts{}, nil)
			up, _, err := u.extractNow(context.Background(), Source{Path: bin, Binary: bin})
			if err != nil {
				t.Fatal(err)
			}
			// The gateway: the upload alone, in a folder of its own.
			gw := filepath.Join(t.TempDir(), "uploaded.debug")
			if err := os.Rename(up, gw); err != nil {
				t.Fatal(err)
			}
			ef, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			text := ef.Section(".text")
			ef.Close()
			var addrs []uint64
			for a := text.Addr; a < text.Addr+text.Size; a += text.Size/800 | 1 {
				addrs = append(addrs, a)
			}
			want := testfixture.LLVMSymbolize(t, bin, addrs, "--inlines", "--no-demangle")
			opt := symbolize.DefaultOptions()
			opt.Demangle = false
			r := symbolize.New(opt)
			defer r.Close()
			got := r.Symbolize(context.Background(), "", gw, addrs)
			differ, inlined := 0, 0
			for i := range addrs {
				var g, w []string
				for _, f := range got[i].Frames {
					g = append(g, fmt.Sprintf("%s@%s:%d", f.Function, f.File, f.Line))
				}
				for _, f := range want[i] {
					if f.FunctionName != "" || f.Line != 0 { // llvm's "??:0" is no frame
						w = append(w, fmt.Sprintf("%s@%s:%d", f.FunctionName, f.FileName, f.Line))
					}
				}
				inlined += max(len(w)-1, 0)
				if fmt.Sprint(g) != fmt.Sprint(w) {
					if differ++; differ <= 3 {
						t.Errorf("%#x: uploaded %v (%v), llvm %v", addrs[i], g, got[i].Err, w)
					}
				}
			}
			t.Logf("%d addresses, %d inlined frames, %d differ from llvm-symbolizer-19 on the host's files", len(addrs), inlined, differ)
			if inlined < len(addrs)/2 {
				t.Errorf("only %d inlined frames: the fixture does not test the split units", inlined)
			}
		})
	}
}
