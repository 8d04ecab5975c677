package symbolize

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// slowFile writes a debug file whose DWARF inflates to size bytes: opening
// it takes a while (about a second for 64 MiB here).
func slowFile(t *testing.T, size int64) string {
	sec := testfixture.CompressedSection(t, ".debug_info", elf.COMPRESS_ZLIB, size, size)
	p := filepath.Join(t.TempDir(), "slow.debug")
	if err := os.WriteFile(p, testfixture.BuildELF(testfixture.BuildIDNote(t, "5105105105105105105105105105105105105105"), sec), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// With LoadTimeout, a caller that stops waiting gets ErrPending and the
// load goes on, once, so a later caller finds the object; MaxLoads bounds
// the loads running at once, and one waiting for a place is pending too.
func TestDetachedLoads(t *testing.T) {
	slow := slowFile(t, 64<<20)
	quick := testfixture.Build(t, testfixture.Spec{Name: "prog-loads", Lang: "c", Sources: []string{"processor/prog.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id", "-DSEED=13"}})
	var opened atomic.Int64
	opt := DefaultOptions()
	opt.LoadTimeout, opt.MaxLoads = time.Minute, 1
	opt.Open = func(ctx context.Context, path string, lim elfx.Limits) (*elfx.File, error) {
		opened.Add(1)
		return elfx.OpenContext(ctx, path, lim)
	}
	r := New(opt)
	defer r.Close()

	wait := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	start := time.Now()
	if _, err := r.Open(wait(50*time.Millisecond), "", slow); frame.Reason(err) != "pending" {
		t.Fatalf("slow file, short wait: %v, want pending", err)
	}
	if took := time.Since(start); took > time.Second/2 {
		t.Errorf("the caller waited %v", took)
	}
	// The one place is taken by the slow load: a quick file waits for it.
	if _, err := r.Open(wait(50*time.Millisecond), quick, ""); frame.Reason(err) != "pending" {
		t.Fatalf("quick file while the place is taken: %v, want pending", err)
	}
	h, err := r.Open(context.Background(), "", slow)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	t.Logf("slow file opened after %v", time.Since(start))
	if h, err = r.Open(context.Background(), quick, ""); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if n := opened.Load(); n != 2 {
		t.Errorf("%d files opened, want each once", n)
	}

	// Without LoadTimeout, the caller's context bounds the load (as before).
	// Writing the file may itself outlast the 50 ms under load (CI once):
	// the open then meets an expired context, a timeout too.
	r2 := New(DefaultOptions())
	defer r2.Close()
	if _, err := r2.Open(wait(50*time.Millisecond), "", slowFile(t, 64<<20)); frame.Reason(err) != "timeout" {
		t.Errorf("attached load: %v, want timeout", err)
	}
}

// A debug file that was all there was to open keeps its reason: with a
// context already done, that is a timeout, not "no file" (CI once wrote
// TestDetachedLoads' file past its 50 ms and got not_found).
func TestDebugOnlyOpenKeepsReason(t *testing.T) {
	slow := slowFile(t, 1<<20)
	r := New(DefaultOptions())
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Open(ctx, "", slow); frame.Reason(err) != "timeout" {
		t.Errorf("debug file with a done context: %v, want timeout", err)
	}
}
