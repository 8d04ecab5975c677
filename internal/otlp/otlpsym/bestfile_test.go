package otlpsym

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/testfixture"
)

func splitFixture(t *testing.T) (bin, stripped, debug string) {
	bin = fixture(t, "otlpsym-split", "-Wl,--build-id")
	stripped, debug = testfixture.SplitDebug(t, bin, false)
	return bin, stripped, debug
}

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(to), 0o755)
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// linedCount counts how many of locs were named with a line number.
func linedCount(t *testing.T, s *Symbolizer, frames []rawFrame) (int, string) {
	t.Helper()
	pd, locs := rawProfile(frames...)
	s.Profiles(context.Background(), pd)
	n := 0
	for _, l := range locs {
		ls := pd.Dictionary().LocationTable().At(int(l)).Lines()
		if ls.Len() > 0 && ls.At(0).Line() != 0 {
			n++
		}
	}
	return n, reasonOf(pd, locs[0])
}

// The best file wins: a stripped binary at the mapping's path must not
// replace an unstripped copy in a symbol directory. Before, the local path
// replaced it and every frame ended no_debug_info.
func TestBestFileSymbolDir(t *testing.T) {
	bin, stripped, _ := splitFixture(t)
	sym := t.TempDir()
	copyTo(t, bin, filepath.Join(sym, "hot-unstripped"))
	hot := inside(t, bin, "hot")
	opt := defaults()
	opt.Locate = locate.Config{Order: []string{locate.SourceLocal, locate.SourceSymbolDirs}, SymbolDirs: []string{sym}}
	s := newSym(t, opt)
	if n, reason := linedCount(t, s, []rawFrame{{stripped, idsOf(t, stripped), hot, ""}}); n != 1 {
		t.Errorf("stripped local + unstripped in a symbol directory: no lines (reason %q)", reason)
	}
}

// The 4-resolve-debuginfod case: a real debuginfod server indexing a folder
// that holds hot (unstripped) and hot.debug, the stripped hot at the
// mapping's path. Before: 0/256 frames with lines.
func TestBestFileDebuginfodServerDir(t *testing.T) {
	bin, stripped, debug := splitFixture(t)
	srvDir := t.TempDir()
	copyTo(t, bin, filepath.Join(srvDir, "hot"))
	copyTo(t, debug, filepath.Join(srvDir, "hot.debug"))
	ids := idsOf(t, stripped)
	srv := testfixture.StartDebuginfod(t, srvDir, ids.gnu+"/debuginfo")
	client, err := debuginfod.New(debuginfod.Config{URLs: []string{srv.URL}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hot := inside(t, bin, "hot")
	var frames []rawFrame
	for i := 0; i < 256; i++ {
		frames = append(frames, rawFrame{stripped, ids, hot + uint64(i%8), ""})
	}
	opt := defaults()
	opt.Locate = locate.Config{Order: []string{locate.SourceLocal, locate.SourceDebuginfod}, Debuginfod: client}
	s := newSym(t, opt)
	n, reason := linedCount(t, s, frames)
	if n != 256 {
		t.Errorf("server dir holding hot and hot.debug: %d/256 frames with lines (reason %q)", n, reason)
	}
}

// An unstripped executable that a server returns for /debuginfo is used as
// debug info, and a stripped debug directory copy does not displace it.
func TestBestFileUnstrippedAsDebuginfo(t *testing.T) {
	bin, stripped, _ := splitFixture(t)
	full, _ := os.ReadFile(bin)
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/debuginfo") {
			w.Write(full)
			return
		}
		http.NotFound(w, r)
	})
	client, err := debuginfod.New(debuginfod.Config{URLs: []string{url}, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ids := idsOf(t, stripped)
	// The stripped binary is also under the debug directory's build-id link.
	dd := t.TempDir()
	copyTo(t, stripped, filepath.Join(dd, ".build-id", ids.gnu[:2], ids.gnu[2:]))
	hot := inside(t, bin, "hot")
	for _, file := range []string{stripped, "/gone/hot"} {
		opt := defaults()
		opt.Locate = locate.Config{Order: []string{locate.SourceLocal, locate.SourceDebugDirs, locate.SourceDebuginfod},
			DebugDirs: []string{dd}, Debuginfod: client}
		s := newSym(t, opt)
		if n, reason := linedCount(t, s, []rawFrame{{file, ids, hot, ""}}); n != 1 {
			t.Errorf("%s: no lines (reason %q)", file, reason)
		}
	}
}

func serve(t *testing.T, h http.HandlerFunc) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// Errors expire: an address answered no_debug_info is named once its file
// appears in a symbol directory (rescan and negative TTL short), and an
// address answered from a stripped binary's symbol table gets lines once a
// debug file appears. Before, both answers stuck forever.
func TestErrorsExpire(t *testing.T) {
	bin, stripped, debug := splitFixture(t)
	hot := inside(t, bin, "hot")
	ids := idsOf(t, bin)

	t.Run("symbol directory", func(t *testing.T) {
		sym := t.TempDir()
		opt := defaults()
		opt.NegativeTTL = 50 * time.Millisecond
		opt.Locate = locate.Config{Order: []string{locate.SourceSymbolDirs}, SymbolDirs: []string{sym}, Rescan: 50 * time.Millisecond}
		s := newSym(t, opt)
		if n, reason := linedCount(t, s, []rawFrame{{"/gone/hot", ids, hot, ""}}); n != 0 || reason != "no_debug_info" {
			t.Fatalf("before the file: %d lined, reason %q", n, reason)
		}
		copyTo(t, bin, filepath.Join(sym, "hot"))
		if !eventually(t, func() bool { n, _ := linedCount(t, s, []rawFrame{{"/gone/hot", ids, hot, ""}}); return n == 1 }) {
			t.Error("the file that appeared was never used for an address already seen")
		}
	})
	t.Run("debug file after a stripped binary", func(t *testing.T) {
		dd := t.TempDir()
		opt := defaults()
		opt.NegativeTTL = 50 * time.Millisecond
		opt.Locate = locate.Config{Order: []string{locate.SourceLocal, locate.SourceDebugDirs}, DebugDirs: []string{dd}}
		s := newSym(t, opt)
		// The stripped executable alone has no name for hot (.dynsym
		// holds only exported symbols): the answer is no_debug_info.
		if n, reason := linedCount(t, s, []rawFrame{{stripped, ids, hot, ""}}); n != 0 {
			t.Fatalf("stripped binary alone gave lines (%q)", reason)
		}
		copyTo(t, debug, filepath.Join(dd, ".build-id", ids.gnu[:2], ids.gnu[2:]+".debug"))
		if !eventually(t, func() bool { n, _ := linedCount(t, s, []rawFrame{{stripped, ids, hot, ""}}); return n == 1 }) {
			t.Error("the debug file that appeared never gave lines to an address already seen")
		}
	})
	t.Run("lines after a name from .dynsym", func(t *testing.T) {
		lib := testfixture.Build(t, testfixture.Spec{Name: "otlpsym-lib.so", Lang: "c",
			Sources: []string{"engine/c/lib.c", "engine/c/hash.c", "engine/c/sort.c"},
			Args:    []string{"-O2", "-g", "-shared", "-fPIC", "-Wl,--build-id"}})
		strippedLib, debugLib := testfixture.SplitDebug(t, lib, false)
		entry := inside(t, lib, "lib_entry")
		lids := idsOf(t, lib)
		dd := t.TempDir()
		opt := defaults()
		opt.NegativeTTL = 50 * time.Millisecond
		opt.Locate = locate.Config{Order: []string{locate.SourceLocal, locate.SourceDebugDirs}, DebugDirs: []string{dd}}
		s := newSym(t, opt)
		pd, locs := rawProfile(rawFrame{strippedLib, lids, entry, ""})
		s.Profiles(context.Background(), pd)
		if got := names(pd, locs[0]); len(got) != 1 || got[0] != "lib_entry" {
			t.Fatalf("stripped library: %v (%q), want lib_entry from .dynsym", got, reasonOf(pd, locs[0]))
		}
		copyTo(t, debugLib, filepath.Join(dd, ".build-id", lids.gnu[:2], lids.gnu[2:]+".debug"))
		if !eventually(t, func() bool { n, _ := linedCount(t, s, []rawFrame{{strippedLib, lids, entry, ""}}); return n == 1 }) {
			t.Error("an answer from .dynsym was kept after the debug file appeared")
		}
	})
	t.Run("debuginfod after negative_ttl", func(t *testing.T) {
		var serving atomic.Bool
		data, _ := os.ReadFile(debug)
		url := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if serving.Load() && strings.HasSuffix(r.URL.Path, "/debuginfo") {
				w.Write(data)
				return
			}
			http.NotFound(w, r)
		})
		client, err := debuginfod.New(debuginfod.Config{URLs: []string{url}, CacheDir: t.TempDir(), NegativeTTL: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		opt := defaults()
		opt.NegativeTTL = 50 * time.Millisecond
		opt.Locate = locate.Config{Order: []string{locate.SourceDebuginfod}, Debuginfod: client}
		s := newSym(t, opt)
		if n, reason := linedCount(t, s, []rawFrame{{"/gone/hot", ids, hot, ""}}); n != 0 || reason != "no_debug_info" {
			t.Fatalf("before the server has it: %d, %q", n, reason)
		}
		serving.Store(true)
		if !eventually(t, func() bool { n, _ := linedCount(t, s, []rawFrame{{"/gone/hot", ids, hot, ""}}); return n == 1 }) {
			t.Error("the server's later answer never reached an address already seen")
		}
	})
}

func eventually(t *testing.T, f func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if f() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
