package symbolize

import (
	"context"
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// Handle.Missing tells a frame named from the symbol table because the
// DWARF could not be used (here: it decompresses past the limit) from one
// with lines, and from an address nothing names.
func TestMissing(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "prog-gz", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-gz=zlib", "-Wl,--build-id", "-DSEED=12"}})
	start, size := testfixture.Func(t, bin, "hot")
	for _, tc := range []struct {
		limit int64
		want  error
	}{{0, nil}, {1024, frame.ErrLimitExceeded}} {
		opt := DefaultOptions()
		opt.Limits = elfx.Limits{MaxDecompressedBytes: tc.limit}
		r := New(opt)
		h, err := r.Open(context.Background(), bin, "")
		if err != nil {
			t.Fatal(err)
		}
		frames, err := h.Lookup(start+size/2, nil)
		if err != nil || len(frames) == 0 || frames[len(frames)-1].Function != "hot" {
			t.Fatalf("limit %d: %v %+v", tc.limit, err, frames)
		}
		if m := h.Missing(); tc.want == nil && m != nil || tc.want != nil && !errors.Is(m, tc.want) {
			t.Errorf("limit %d: Missing() = %v, want %v (lines %d)", tc.limit, m, tc.want, frames[0].Line)
		}
		if tc.want != nil && frames[0].Line != 0 {
			t.Errorf("limit %d: line %d from refused DWARF", tc.limit, frames[0].Line)
		}
		if _, err := h.Lookup(1, nil); err == nil || h.Missing() != nil {
			t.Errorf("limit %d: unnamed address: err %v, Missing %v", tc.limit, err, h.Missing())
		}
		h.Close()
		r.Close()
	}
}
