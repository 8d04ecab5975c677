package otlpsym

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/testfixture"
)

// On the cold path each file is opened once: the chain opens a candidate
// to check its identity and hands it to the engine, which does not open
// it again. A stripped binary and its debug file: two files, two opens.
func TestColdPathOpensOnce(t *testing.T) {
	bin := fixture(t, "otlpsym-cold", "-Wl,--build-id")
	stripped, debug := testfixture.SplitDebug(t, bin, false)
	ids := idsOf(t, stripped)
	dir := t.TempDir()
	p := filepath.Join(dir, ".build-id", ids.gnu[:2], ids.gnu[2:]+".debug")
	os.MkdirAll(filepath.Dir(p), 0o755)
	data, _ := os.ReadFile(debug)
	os.WriteFile(p, data, 0o644)
	hot := inside(t, bin, "hot")
	want := engineNames(t, bin, hot)

	opt := defaults()
	opt.Locate.Order = []string{locate.SourceLocal, locate.SourceDebugDirs}
	opt.Locate.DebugDirs = []string{dir}
	s := newSym(t, opt)
	pd, locs := rawProfile(rawFrame{stripped, ids, hot, ""})
	before := elfx.Opens()
	s.Profiles(context.Background(), pd)
	if n := elfx.Opens() - before; n != 2 {
		t.Errorf("cold batch over a binary and its debug file opened %d files, want 2", n)
	}
	if got := names(pd, locs[0]); len(got) == 0 || got[len(got)-1] != want[len(want)-1] {
		t.Errorf("named %v, want %v (reason %q)", got, want, reasonOf(pd, locs[0]))
	}
	// Nothing is left held for the engine: every file it chose was taken.
	if f := s.chain.TakeOpened(stripped); f != nil {
		f.Close()
		t.Error("the binary is still held after the engine opened it")
	}
}
