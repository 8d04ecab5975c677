package symbolizationprocessor

import (
	"debug/elf"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// A debug file built as a ZIP bomb (three zlib sections each claiming 2 GiB,
// the file that OOM-killed a gateway) served by debuginfod next to a healthy
// one: its frame ends limit_exceeded, the healthy frame in the same batch is
// named, and the batch flows on.
func TestZipBombDebugFileInBatch(t *testing.T) {
	good := buildVariant(t, 11)
	debug, err := os.ReadFile(good.debug)
	if err != nil {
		t.Fatal(err)
	}
	const bombID = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	secs := []testfixture.Section{testfixture.BuildIDNote(t, bombID)}
	for _, name := range []string{".debug_info", ".debug_line", ".debug_str"} {
		secs = append(secs, testfixture.CompressedSection(t, name, elf.COMPRESS_ZLIB, 2<<30, 1<<20))
	}
	bomb := testfixture.BuildELF(secs...)
	files := map[string][]byte{good.id + "/debuginfo": debug, bombID + "/debuginfo": bomb}
	url := loopServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[strings.TrimPrefix(r.URL.Path, "/buildid/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	})
	h := newHarness(t, func(cfg *Config) { cfg.Debuginfod.URLs = []string{url} })
	got := h.run(t, profile(good, variant{id: bombID, hot: 0x1100}))
	t.Logf("outcomes: %+v", got)
	if got[0].name != "hot" {
		t.Errorf("healthy frame: %+v, want hot", got[0])
	}
	if got[1].reason != "limit_exceeded" {
		t.Errorf("bomb frame: %+v, want reason limit_exceeded", got[1])
	}
}
