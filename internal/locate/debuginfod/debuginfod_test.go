package debuginfod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/clock"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// Build ids are fixed with --build-id=0x... so fixtures of one source differ.
var (
	idA = strings.Repeat("a1", 20) // -g, split into stripped + debug
	idB = strings.Repeat("b2", 20) // -g, split: "another build" bytes
	idC = strings.Repeat("c3", 20) // no -g, stripped: executable only
	idD = strings.Repeat("d4", 20) // no -g, unstripped: no .debug_info
	idE = strings.Repeat("e5", 20) // -g, split
	idF = strings.Repeat("f6", 20) // -g, split
	// idNone is asked for but exists nowhere.
	idNone = strings.Repeat("09", 20)
)

func cBuild(t testing.TB, name, id string, debug bool) string {
	t.Helper()
	args := []string{"-O1", "-Wl,--build-id=0x" + id}
	if debug {
		args = append(args, "-g")
	}
	return testfixture.Build(t, testfixture.Spec{Name: name, Lang: "c", Sources: []string{"elf/hello.c"}, Args: args})
}

// split builds a -g program and returns (unstripped, stripped, debug).
func split(t testing.TB, name, id string) (string, string, string) {
	t.Helper()
	bin := cBuild(t, name, id, true)
	s, d := testfixture.SplitDebug(t, bin, false)
	return bin, s, d
}

func stripped(t testing.TB, name, id string) string {
	t.Helper()
	bin := cBuild(t, name, id, false)
	out := filepath.Join(t.TempDir(), name)
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--strip-all", bin, out)
	return out
}

func read(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fileID(t testing.TB, p string) string {
	t.Helper()
	f, err := elfx.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := buildid.GNU(f)
	if err != nil {
		t.Fatal(err)
	}
	return buildid.HexString(id)
}

func freePort(t testing.TB) int { return testfixture.FreePort(t) }

// startDebuginfod runs the real elfutils server over dir and waits until
// every (id, kind) in ready is served.
func startDebuginfod(t *testing.T, dir string, ready map[string]Kind) *testfixture.Debuginfod {
	var want []string
	for id, k := range ready {
		want = append(want, id+"/"+k.String())
	}
	return testfixture.StartDebuginfod(t, dir, want...)
}

// loopServer is a plain HTTP server on loopback whose behaviour the test
// scripts; it counts requests and the most that ran at once.
type loopServer struct {
	URL     string
	reqs    atomic.Int64
	active  atomic.Int64
	maxConc atomic.Int64
	srv     *http.Server
}

func startLoop(t *testing.T, h http.HandlerFunc) *loopServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &loopServer{URL: "http://" + ln.Addr().String()}
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reqs.Add(1)
		n := s.active.Add(1)
		defer s.active.Add(-1)
		for {
			m := s.maxConc.Load()
			if n <= m || s.maxConc.CompareAndSwap(m, n) {
				break
			}
		}
		h(w, r)
	})}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

// serveFiles answers /buildid/ID/KIND from files, 404 otherwise.
func serveFiles(files map[string][]byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[strings.TrimPrefix(r.URL.Path, "/buildid/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

// pause waits d or until the client goes away, so handlers end by themselves.
func pause(r *http.Request, d time.Duration) {
	select {
	case <-time.After(d):
	case <-r.Context().Done():
	}
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cachedFiles lists regular files under dir (temp files included) and
// their total size.
func cachedFiles(t *testing.T, dir string) ([]string, int64) {
	t.Helper()
	var names []string
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		names = append(names, rel)
		total += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, total
}

func wantErr(t *testing.T, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v, want %v", err, sentinel)
	}
	if got := frame.Reason(err); got != sentinel.Error() {
		t.Fatalf("Reason(%v) = %q, want %q", err, got, sentinel)
	}
}

func TestDebuginfodServer(t *testing.T) {
	_, strippedA, debugA := split(t, "a", idA)
	exeC := stripped(t, "c", idC)
	idx := t.TempDir()
	for dst, src := range map[string]string{"a": strippedA, "a.debug": debugA, "c": exeC} {
		if err := os.WriteFile(filepath.Join(idx, dst), read(t, src), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	srv := startDebuginfod(t, idx, map[string]Kind{idA: DebugInfo, idC: Executable})
	cache := t.TempDir()
	c := newClient(t, Config{URLs: []string{srv.URL + "/"}, CacheDir: cache, Timeout: 5 * time.Second})
	ctx := context.Background()

	// Upper case ids are the same ids.
	dbg, err := c.Fetch(ctx, strings.ToUpper(idA), DebugInfo)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cache, idA, "debuginfo"); dbg != want {
		t.Fatalf("path %s, want %s", dbg, want)
	}
	exe, err := c.Fetch(ctx, idA, Executable)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{dbg, debugA}, {exe, strippedA}} {
		if fileID(t, p[0]) != idA || !bytes.Equal(read(t, p[0]), read(t, p[1])) {
			t.Fatalf("%s is not %s", p[0], p[1])
		}
	}
	fetched := int64(len(read(t, debugA)) + len(read(t, strippedA)))
	if st := c.Stats(); st.Misses != 2 || st.Hits != 0 || st.BytesFetched != fetched || st.CacheBytes != fetched || st.CacheFiles != 2 || st.FetchLatency <= 0 {
		t.Fatalf("stats after two downloads: %+v", st)
	}

	// Unknown id: 404, then remembered.
	_, err = c.Fetch(ctx, idNone, DebugInfo)
	wantErr(t, err, frame.ErrNotFound)
	_, err = c.Fetch(ctx, idNone, DebugInfo)
	wantErr(t, err, frame.ErrNotFound)
	if st := c.Stats(); st.NegativeHits != 1 || st.Fetches != 3 || st.Errors["not_found"] != 1 {
		t.Fatalf("stats after unknown id: %+v", st)
	}

	// C has only an executable.
	if p, err := c.Fetch(ctx, idC, Executable); err != nil || fileID(t, p) != idC {
		t.Fatalf("Fetch(C, executable) = %q, %v", p, err)
	}

	// Without the server, both files come from disk.
	srv.Stop()
	before := c.Stats()
	for _, k := range []Kind{DebugInfo, Executable} {
		if _, err := c.Fetch(ctx, idA, k); err != nil {
			t.Fatalf("cached %v after server stop: %v", k, err)
		}
	}
	if st := c.Stats(); st.Hits != before.Hits+2 || st.Fetches != before.Fetches {
		t.Fatalf("cache hits used the network: before %+v after %+v", before, st)
	}

	// A new client (a restart) indexes the folder and serves from it.
	c2 := newClient(t, Config{URLs: []string{srv.URL}, CacheDir: cache, Timeout: time.Second})
	if st := c2.Stats(); st.CacheFiles != 3 || st.CacheBytes != fetched+int64(len(read(t, exeC))) {
		t.Fatalf("restart index: %+v", st)
	}
	if p, err := c2.Fetch(ctx, idA, DebugInfo); err != nil || p != dbg {
		t.Fatalf("after restart: %q %v", p, err)
	}
	if st := c2.Stats(); st.Hits != 1 || st.Fetches != 0 {
		t.Fatalf("restart stats: %+v", st)
	}
}

func TestMismatchAndCorrupt(t *testing.T) {
	_, _, debugA := split(t, "a", idA)
	_, _, debugB := split(t, "b", idB)
	noID := testfixture.Build(t, testfixture.Spec{Name: "noid", Lang: "c", Sources: []string{"elf/hello.c"},
		Args: []string{"-O1", "-Wl,--build-id=none"}})
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"other build", read(t, debugB), frame.ErrBuildIDMismatch},
		{"no build id", read(t, noID), frame.ErrBuildIDMismatch},
		{"not ELF", []byte("<html>certainly not a debug file</html>"), frame.ErrCorruptFile},
		{"empty", nil, frame.ErrCorruptFile},
		{"truncated ELF", read(t, debugA)[:200], frame.ErrCorruptFile},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { w.Write(tc.body) })
			c := newClient(t, Config{URLs: []string{srv.URL}})
			_, err := c.Fetch(context.Background(), idA, DebugInfo)
			wantErr(t, err, tc.want)
			if names, _ := cachedFiles(t, c.CacheDir()); len(names) != 0 {
				t.Fatalf("left in cache: %v", names)
			}
			if st := c.Stats(); st.CacheFiles != 0 || st.Errors[tc.want.Error()] != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestShortAndOversizedBodies(t *testing.T) {
	_, _, debugA := split(t, "a", idA)
	body := read(t, debugA)
	cases := []struct {
		name    string
		h       http.HandlerFunc
		maxFile int64
	}{
		{"short body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)+1000))
			w.Write(body)
		}, 0},
		{"Content-Length over limit", serveFiles(map[string][]byte{idA + "/debuginfo": body}), 1000},
		{"chunked body over limit", func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush() // no Content-Length: chunked
			w.Write(body)
		}, 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startLoop(t, tc.h)
			c := newClient(t, Config{URLs: []string{srv.URL}, MaxFileBytes: tc.maxFile})
			_, err := c.Fetch(context.Background(), idA, DebugInfo)
			if tc.maxFile > 0 {
				wantErr(t, err, frame.ErrLimitExceeded)
			} else {
				wantErr(t, err, frame.ErrFetchFailed)
			}
			if names, _ := cachedFiles(t, c.CacheDir()); len(names) != 0 {
				t.Fatalf("left in cache: %v", names)
			}
		})
	}
}

func TestTimeouts(t *testing.T) {
	const timeout = 300 * time.Millisecond
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	t.Run("no response", func(t *testing.T) {
		srv := startLoop(t, hang)
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: timeout, Clock: clk})
		start := clk.Now()
		res := fetchAsync(c, idA, Wait{})
		clk.WaitTimersAt(start.Add(timeout), 1) // the watchdog
		waitRequests(t, srv, 1)
		clk.Advance(timeout - time.Nanosecond)
		notYet(t, res, "Fetch")
		clk.Advance(time.Nanosecond)
		wantErr(t, <-res, frame.ErrTimeout)
		// The hung server is skipped for other ids rather than costing
		// Timeout again, and the failure is remembered for this id: with
		// the clock stopped, both calls return.
		var err, err2 error
		within(t, "later fetches", func() {
			_, err = c.Fetch(context.Background(), idB, DebugInfo)
			_, err2 = c.Fetch(context.Background(), idA, DebugInfo)
		})
		wantErr(t, err, frame.ErrTimeout)
		wantErr(t, err2, frame.ErrTimeout)
		if srv.reqs.Load() != 1 {
			t.Fatalf("%d requests, want 1", srv.reqs.Load())
		}
		if st := c.Stats(); st.NegativeHits != 1 || st.Errors["timeout"] != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("stalled body", func(t *testing.T) {
		srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000000")
			w.Write([]byte("\x7fELF"))
			w.(http.Flusher).Flush()
			hang(w, r)
		})
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: timeout, Clock: clk})
		start := clk.Now()
		res := fetchAsync(c, idA, Wait{})
		clk.WaitTimersAt(start.Add(timeout), 1)
		waitRequests(t, srv, 1)
		notYet(t, res, "Fetch")
		clk.Advance(timeout)
		wantErr(t, <-res, frame.ErrTimeout)
		if names, _ := cachedFiles(t, c.CacheDir()); len(names) != 0 {
			t.Fatalf("left in cache: %v", names)
		}
	})
	t.Run("caller gives up, download goes on", func(t *testing.T) {
		_, _, debugA := split(t, "a", idA)
		files := serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)})
		release := make(chan struct{})
		srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { <-release; files(w, r) })
		c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 5 * time.Second, Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { _, err := c.Fetch(ctx, idA, DebugInfo); res <- err }()
		waitRequests(t, srv, 1)
		cancel()
		var err error
		within(t, "the caller that gave up", func() { err = <-res })
		wantErr(t, err, frame.ErrPending)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("caller's cancellation: %v", err)
		}
		// A patient caller joins the same download.
		close(release)
		within(t, "the patient caller", func() { _, err = c.Fetch(context.Background(), idA, DebugInfo) })
		if err != nil {
			t.Fatal(err)
		}
		if n := srv.reqs.Load(); n != 1 {
			t.Fatalf("%d requests, want 1", n)
		}
		if st := c.Stats(); st.Abandoned != 1 || st.Shared != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// A refused connection fails at once and is remembered: with the clock
// stopped, both calls return.
func TestConnectionRefused(t *testing.T) {
	c := newClient(t, Config{URLs: []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, Timeout: 2 * time.Second,
		Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
	var err, err2 error
	within(t, "Fetch", func() {
		_, err = c.Fetch(context.Background(), idA, DebugInfo)
		_, err2 = c.Fetch(context.Background(), idA, DebugInfo)
	})
	wantErr(t, err, frame.ErrFetchFailed)
	wantErr(t, err2, frame.ErrFetchFailed)
	if st := c.Stats(); st.NegativeHits != 1 || st.Fetches != 1 || st.Errors["fetch_failed"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A miss is remembered for exactly NegativeTTL.
func TestNegativeTTL(t *testing.T) {
	const ttl = 150 * time.Millisecond
	srv := startLoop(t, http.NotFound)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	c := newClient(t, Config{URLs: []string{srv.URL}, NegativeTTL: ttl, Clock: clk})
	for i, step := range []time.Duration{0, ttl - time.Nanosecond} {
		clk.Advance(step)
		_, err := c.Fetch(context.Background(), idA, DebugInfo)
		wantErr(t, err, frame.ErrNotFound)
		if n := srv.reqs.Load(); n != 1 {
			t.Fatalf("call %d: %d requests, want 1", i, n)
		}
	}
	clk.Advance(time.Nanosecond)
	_, err := c.Fetch(context.Background(), idA, DebugInfo)
	wantErr(t, err, frame.ErrNotFound)
	if n := srv.reqs.Load(); n != 2 {
		t.Fatalf("after TTL: %d requests, want 2", n)
	}
	// Kinds are remembered separately.
	c.Fetch(context.Background(), idA, Executable)
	if n := srv.reqs.Load(); n != 3 {
		t.Fatalf("other kind: %d requests, want 3", n)
	}
}

func TestServerOrder(t *testing.T) {
	_, _, debugA := split(t, "a", idA)
	good := startLoop(t, serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)}))
	missing := startLoop(t, http.NotFound)
	missing2 := startLoop(t, http.NotFound)
	broken := startLoop(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusBadGateway) })

	c := newClient(t, Config{URLs: []string{missing.URL, good.URL, broken.URL}})
	if _, err := c.Fetch(context.Background(), idA, DebugInfo); err != nil {
		t.Fatal(err)
	}
	if broken.reqs.Load() != 0 || missing.reqs.Load() != 1 {
		t.Fatalf("requests: missing %d broken %d", missing.reqs.Load(), broken.reqs.Load())
	}
	// A failure anywhere is not "not found": the file may exist there.
	c = newClient(t, Config{URLs: []string{broken.URL, missing.URL}})
	_, err := c.Fetch(context.Background(), idA, DebugInfo)
	wantErr(t, err, frame.ErrFetchFailed)
	c = newClient(t, Config{URLs: []string{missing.URL, missing2.URL}})
	_, err = c.Fetch(context.Background(), idA, DebugInfo)
	wantErr(t, err, frame.ErrNotFound)
	c = newClient(t, Config{})
	_, err = c.Fetch(context.Background(), idA, DebugInfo)
	wantErr(t, err, frame.ErrNotFound)
}

func TestSingleflight(t *testing.T) {
	_, _, debugA := split(t, "a", idA)
	files := serveFiles(map[string][]byte{idA + "/debuginfo": read(t, debugA)})
	srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { pause(r, 200*time.Millisecond); files(w, r) })
	c := newClient(t, Config{URLs: []string{srv.URL}})
	const n = 50
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { paths[i], errs[i] = c.Fetch(context.Background(), idA, DebugInfo) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("caller %d: %q %v", i, paths[i], errs[i])
		}
	}
	if got := srv.reqs.Load(); got != 1 {
		t.Fatalf("%d HTTP requests, want 1", got)
	}
	if st := c.Stats(); st.Requests != n || st.Misses != 1 || st.Shared+st.Hits != n-1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMaxParallel(t *testing.T) {
	srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { pause(r, 100*time.Millisecond); http.NotFound(w, r) })
	c := newClient(t, Config{URLs: []string{srv.URL}, MaxParallel: 2})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() { c.Fetch(context.Background(), fmt.Sprintf("%040x", i+1), DebugInfo) })
	}
	wg.Wait()
	if srv.reqs.Load() != 6 || srv.maxConc.Load() != 2 {
		t.Fatalf("%d requests, at most %d at once; want 6 and 2", srv.reqs.Load(), srv.maxConc.Load())
	}
}

func TestCacheBound(t *testing.T) {
	files := map[string][]byte{}
	var ids []string
	for _, f := range []struct{ name, id string }{{"a", idA}, {"b", idB}, {"e", idE}, {"f", idF}} {
		_, _, d := split(t, f.name, f.id)
		files[f.id+"/debuginfo"] = read(t, d)
		ids = append(ids, f.id)
	}
	size := int64(len(files[idA+"/debuginfo"]))
	bound := size * 5 / 2 // room for two files
	srv := startLoop(t, serveFiles(files))
	c := newClient(t, Config{URLs: []string{srv.URL}, MaxCacheBytes: bound})
	ctx := context.Background()
	check := func(step string, want ...string) {
		t.Helper()
		names, total := cachedFiles(t, c.CacheDir())
		if total > bound {
			t.Fatalf("%s: cache holds %d bytes > bound %d: %v", step, total, bound, names)
		}
		if st := c.Stats(); st.CacheBytes != total || st.CacheFiles != int64(len(names)) {
			t.Fatalf("%s: stats %+v, disk %d bytes in %v", step, st, total, names)
		}
		for _, id := range want {
			if _, err := os.Stat(filepath.Join(c.CacheDir(), id, "debuginfo")); err != nil {
				t.Fatalf("%s: %s evicted; cache %v", step, id, names)
			}
		}
	}
	for _, id := range ids[:2] {
		if _, err := c.Fetch(ctx, id, DebugInfo); err != nil {
			t.Fatal(err)
		}
	}
	check("two files", ids[0], ids[1])
	time.Sleep(10 * time.Millisecond)
	if _, err := c.Fetch(ctx, ids[0], DebugInfo); err != nil { // hit: now the newest
		t.Fatal(err)
	}
	if _, err := c.Fetch(ctx, ids[2], DebugInfo); err != nil {
		t.Fatal(err)
	}
	check("third file evicts the least recently used", ids[0], ids[2])
	if _, err := c.Fetch(ctx, ids[3], DebugInfo); err != nil {
		t.Fatal(err)
	}
	check("fourth", ids[2], ids[3])
	if st := c.Stats(); st.Evictions != 2 || st.Hits != 1 {
		t.Fatalf("stats %+v", st)
	}
	// An evicted file is fetched again.
	if _, err := c.Fetch(ctx, ids[1], DebugInfo); err != nil {
		t.Fatal(err)
	}
	check("refetch", ids[1])
	if srv.reqs.Load() != 5 {
		t.Fatalf("%d requests, want 5", srv.reqs.Load())
	}

	// A smaller bound on restart evicts at once; a body larger than the
	// whole cache is refused.
	c.Close()
	c = newClient(t, Config{URLs: []string{srv.URL}, CacheDir: c.CacheDir(), MaxCacheBytes: size + size/2})
	bound = size + size/2
	check("restart with a smaller bound")
	c = newClient(t, Config{URLs: []string{srv.URL}, MaxCacheBytes: size / 2})
	_, err := c.Fetch(ctx, idA, DebugInfo)
	wantErr(t, err, frame.ErrLimitExceeded)
}

func TestInvalidIDs(t *testing.T) {
	srv := startLoop(t, http.NotFound)
	c := newClient(t, Config{URLs: []string{srv.URL}})
	for _, id := range []string{"", "a", "abc", "zz", "../../etc/passwd", "a1/b2", strings.Repeat("ab", 300)} {
		_, err := c.Fetch(context.Background(), id, DebugInfo)
		wantErr(t, err, frame.ErrNotFound)
	}
	if _, err := c.Fetch(context.Background(), idA, Kind(7)); err == nil {
		t.Fatal("unknown kind accepted")
	}
	if srv.reqs.Load() != 0 {
		t.Fatalf("%d requests for invalid ids", srv.reqs.Load())
	}
}

func TestURLs(t *testing.T) {
	got := ParseURLs("  http://127.0.0.1:8002/ ima:enforcing\nfile:///var/cache https://debug.example/x//\thttp://127.0.0.1:8002 ftp://h ")
	want := []string{"http://127.0.0.1:8002", "https://debug.example/x"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ParseURLs = %q, want %q", got, want)
	}
	if got := ParseURLs(" \n "); len(got) != 0 {
		t.Fatalf("blank: %q", got)
	}

	t.Setenv(EnvURLs, "http://127.0.0.1:1/ http://127.0.0.1:2")
	c := newClient(t, Config{UseEnv: true})
	if got := fmt.Sprint(c.URLs()); got != "[http://127.0.0.1:1 http://127.0.0.1:2]" {
		t.Fatalf("from env: %s", got)
	}
	c = newClient(t, Config{UseEnv: true, URLs: []string{"http://127.0.0.1:3"}})
	if got := fmt.Sprint(c.URLs()); got != "[http://127.0.0.1:3]" {
		t.Fatalf("explicit URLs must win over env: %s", got)
	}
	c = newClient(t, Config{})
	if len(c.URLs()) != 0 {
		t.Fatalf("env read without UseEnv: %v", c.URLs())
	}
	for _, bad := range []string{"127.0.0.1:8002", "file:///x", "http://", "http://h/?q=1"} {
		if _, err := New(Config{URLs: []string{bad}, CacheDir: t.TempDir()}); err == nil {
			t.Fatalf("New accepted %q", bad)
		}
	}
}

func TestDefaults(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if want := filepath.Join(os.Getenv("XDG_CACHE_HOME"), "profsym", "debuginfod"); c.CacheDir() != want {
		t.Fatalf("cache dir %s, want %s", c.CacheDir(), want)
	}
	if c.cfg.Timeout != DefaultTimeout || c.cfg.MaxCacheBytes != DefaultMaxCacheBytes || c.cfg.MaxParallel != DefaultMaxParallel ||
		c.cfg.NegativeTTL != DefaultNegativeTTL || c.limit != DefaultMaxCacheBytes {
		t.Fatalf("defaults %+v", c.cfg)
	}
}

func TestStaleTempRemoved(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, tmpPrefix+"old")
	young := filepath.Join(dir, tmpPrefix+"young")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * staleTmp)
	os.Chtimes(old, past, past)
	newClient(t, Config{CacheDir: dir})
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stale temp kept: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatalf("young temp (maybe another process's download) removed: %v", err)
	}
}

// Close ends the downloads still running: the server here never answers,
// so Close returns only by canceling its request.
func TestClose(t *testing.T) {
	srv := startLoop(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	c := newClient(t, Config{URLs: []string{srv.URL}, Timeout: 10 * time.Second, Clock: clock.NewFake(time.Unix(1_700_000_000, 0))})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { waitRequests(t, srv, 1); cancel() }()
	c.Fetch(ctx, idA, DebugInfo) // leaves a download running
	within(t, "Close", func() { c.Close() })
	_, err := c.Fetch(context.Background(), idA, DebugInfo)
	wantErr(t, err, frame.ErrFetchFailed)
}
