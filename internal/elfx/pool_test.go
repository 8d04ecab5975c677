package elfx_test

import (
	"context"
	"debug/elf"
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// Files that each stay within MaxDecompressedBytes still add up: a pool
// bounds their sum. The file that does not fit fails as a limit that is
// worth retrying (frame.ErrRetry), the reclaimer is asked first, and every
// byte goes back to the pool on Close.
func TestPoolBoundsFilesTogether(t *testing.T) {
	const each = 8 << 20
	img := testfixture.BuildELF(testfixture.CompressedSection(t, ".debug_info", elf.COMPRESS_ZLIB, each, each))
	path := write(t, "bomb", img)
	pool := elfx.NewPool(each*5/2 + 1<<20)
	asked := 0
	var files []*elfx.File
	pool.SetReclaim(func(need int64) {
		asked++
		if need <= 0 {
			t.Errorf("reclaim asked for %d bytes", need)
		}
	})
	lim := elfx.Limits{MaxDecompressedBytes: each + 1, Pool: pool}
	open := func() (*elfx.File, error) {
		f, err := elfx.OpenContext(context.Background(), path, lim)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.SectionData(".debug_info")
		return f, err
	}
	for i := 0; i < 2; i++ {
		f, err := open()
		if err != nil {
			t.Fatalf("file %d within the pool: %v", i, err)
		}
		files = append(files, f)
	}
	f3, err := open()
	if !errors.Is(err, frame.ErrLimitExceeded) || !frame.Transient(err) || frame.Reason(err) != "limit_exceeded" {
		t.Fatalf("third file: %v; want limit_exceeded, transient", err)
	}
	if asked == 0 {
		t.Error("the reclaimer was not asked before refusing")
	}
	if used, limit, refused := pool.Stats(); used > limit || refused == 0 {
		t.Errorf("pool: %d of %d held, %d refused", used, limit, refused)
	}
	f3.Close()
	files[0].Close()
	f4, err := open()
	if err != nil {
		t.Fatalf("after a file closed: %v", err)
	}
	f4.Close()
	files[1].Close()
	if used, _, _ := pool.Stats(); used != 0 {
		t.Errorf("%d bytes still charged after every file closed", used)
	}
	// The reclaimer frees what it can: closing an idle file makes room.
	a, _ := open()
	b, _ := open()
	pool.SetReclaim(func(int64) { a.Close() })
	c, err := open()
	if err != nil {
		t.Errorf("reclaimer closed a file, yet: %v", err)
	}
	b.Close()
	c.Close()
	if used, _, _ := pool.Stats(); used != 0 {
		t.Errorf("%d bytes still charged", used)
	}
}

// Two files inflating side by side with room for one: one of them always
// finishes. (Charged as they grew, each took half the pool and neither
// could finish.)
func TestPoolNoSplitLivelock(t *testing.T) {
	const each = 8 << 20
	img := testfixture.BuildELF(testfixture.CompressedSection(t, ".debug_info", elf.COMPRESS_ZLIB, each, each))
	path := write(t, "bomb", img)
	pool := elfx.NewPool(each * 3 / 2)
	lim := elfx.Limits{MaxDecompressedBytes: each + 1, Pool: pool}
	for round := 0; round < 20; round++ {
		var files [2]*elfx.File
		var errs [2]error
		done := make(chan int)
		for i := range files {
			f, err := elfx.OpenContext(context.Background(), path, lim)
			if err != nil {
				t.Fatal(err)
			}
			files[i] = f
			go func() { _, errs[i] = f.SectionData(".debug_info"); done <- i }()
		}
		<-done
		<-done
		if errs[0] != nil && errs[1] != nil {
			t.Fatalf("round %d: neither file finished: %v; %v", round, errs[0], errs[1])
		}
		for _, f := range files {
			f.Close()
		}
		if used, _, _ := pool.Stats(); used != 0 {
			t.Fatalf("round %d: %d bytes still charged", round, used)
		}
	}
}
