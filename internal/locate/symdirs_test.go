package locate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// The index holds at most max_indexed_files files (a folder of a million
// files cannot make the gateway open them all), and a lookup on an index
// older than the rescan interval sees files added since.
func TestSymbolDirs(t *testing.T) {
	fx := fixtures(t)
	dir := t.TempDir()
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("junk%02d", i)), []byte("not an ELF file"), 0o644)
	}
	d := NewSymbolDirs([]string{dir}, time.Hour, 5)
	if n := d.Files(); n != 5 {
		t.Errorf("indexed %d files, bound 5", n)
	}

	dir2 := t.TempDir()
	d = NewSymbolDirs([]string{dir2}, 30*time.Millisecond, 0)
	q := &Query{ID: frame.Identity{GNU: fx.id.GNU}}
	if c, _ := d.Find(context.Background(), q); len(c) != 0 {
		t.Fatalf("empty folder offered %v", c)
	}
	copyFileTo(t, fx.full, filepath.Join(dir2, "sub", "app"))
	if c, _ := d.Find(context.Background(), q); len(c) != 0 {
		t.Fatalf("found before the rescan interval: %v", c)
	}
	time.Sleep(40 * time.Millisecond)
	if c, _ := d.Find(context.Background(), q); len(c) != 1 {
		t.Fatalf("after the rescan interval: %v", c)
	}
	// By htlhash too (upstream mappings without a GNU build id).
	if c, _ := d.Find(context.Background(), &Query{ID: frame.Identity{HTL: fx.id.HTL}}); len(c) != 1 {
		t.Errorf("by htlhash: %v", c)
	}
}

func copyFileTo(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(to), 0o755)
	os.WriteFile(to, b, 0o755)
}
