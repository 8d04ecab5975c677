package otlpsym

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// heldServer serves a debug file for /debuginfo only once released: until
// then a download of it hangs (as on a slow server or a big file).
func heldServer(t *testing.T, debug string) (url string, release func()) {
	data, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	url = serve(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/debuginfo") {
			http.NotFound(w, r)
			return
		}
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		w.Write(data)
	})
	return url, func() { close(gate) }
}

// A batch waits for a download in flight at most FetchWait: its frame flows
// on pending (raw, or named from the binary's symbol table and marked
// incomplete: pending), nothing about it is remembered (negative_ttl is an
// hour here), and the batch after the file arrived names it with lines.
// Before, the first case waited the whole Timeout in every batch, and the
// second kept the symbol-table answer for negative_ttl.
func TestPendingFetch(t *testing.T) {
	bin, _, debug := splitFixture(t)
	symtab := filepath.Join(t.TempDir(), "hot-symtab")
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--strip-debug", bin, symtab)
	hot := inside(t, bin, "hot")
	ids := idsOf(t, bin)
	const fetchWait = 300 * time.Millisecond

	for _, tc := range []struct {
		name, file string
		order      []string
		// while the download runs: the frame's reason, or its name and
		// incomplete attribute
		reason, incomplete string
	}{
		{"raw while downloading", "/gone/hot", []string{locate.SourceDebuginfod}, "pending", ""},
		{"symbol table while downloading", symtab, []string{locate.SourceLocal, locate.SourceDebuginfod}, "", "pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, release := heldServer(t, debug)
			client, err := debuginfod.New(debuginfod.Config{URLs: []string{url}, CacheDir: t.TempDir(), Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			opt := defaults()
			opt.Timeout, opt.FetchWait, opt.NegativeTTL = 10*time.Second, fetchWait, time.Hour
			opt.Locate = locate.Config{Order: tc.order, Debuginfod: client}
			s := newSym(t, opt)
			frames := []rawFrame{{tc.file, ids, hot, ""}}

			check := func(batch string, maxTook time.Duration, first bool) {
				t.Helper()
				pd, locs := rawProfile(frames...)
				start := time.Now()
				st := s.Profiles(context.Background(), pd)
				took := time.Since(start)
				if took > maxTook {
					t.Errorf("%s took %v; fetch wait %v, timeout %v", batch, took, fetchWait, opt.Timeout)
				}
				checkSamples(t, pd)
				got, reason, inc := names(pd, locs[0]), reasonOf(pd, locs[0]), incompleteOf(pd, locs[0])
				// The first batch spends its wait on the download: the local
				// binary it found is opened in the background, and may not be
				// ready for it.
				if first && tc.incomplete != "" && len(got) == 0 && reason == "pending" {
					return
				}
				if tc.reason != "" && (len(got) != 0 || reason != tc.reason || st.Unresolved[tc.reason] != 1) {
					t.Errorf("%s: %v reason %q (stats %+v), want raw with %q", batch, got, reason, st, tc.reason)
				}
				if tc.incomplete != "" && (len(got) == 0 || got[len(got)-1] != "hot" || inc != tc.incomplete || st.Incomplete[tc.incomplete] != 1) {
					t.Errorf("%s: %v reason %q incomplete %q, want hot marked %q", batch, got, reason, inc, tc.incomplete)
				}
			}
			// First sight: the batch waits up to FetchWait for the download.
			check("first batch", 3*fetchWait, true)
			// The download is now older than FetchWait: no wait for it.
			check("second batch", fetchWait/2, false)
			if st := client.Stats(); st.InFlight != 1 || st.Requests < 2 {
				t.Errorf("client %+v: want the one download in flight", st)
			}

			release()
			var n int
			var reason string
			if !eventually(t, func() bool { n, reason = linedCount(t, s, frames); return n == 1 }) {
				t.Fatalf("never named with lines after the download (reason %q)", reason)
			}
			pd, locs := rawProfile(frames...)
			s.Profiles(context.Background(), pd)
			if inc := incompleteOf(pd, locs[0]); inc != "" {
				t.Errorf("still marked incomplete %q after the download", inc)
			}
			if st := client.Stats(); st.Misses != 1 || st.InFlight != 0 || len(st.Errors) != 0 {
				t.Errorf("client %+v: want one download, no failure", st)
			}
		})
	}
}

func incompleteOf(pd pprofile.Profiles, loc int32) string {
	d := pdict.New(pd.Dictionary())
	v, ok := d.FindAttr(pd.Dictionary().LocationTable().At(int(loc)).AttributeIndices(), frame.AttrIncomplete)
	if !ok {
		return ""
	}
	return v.Str()
}
