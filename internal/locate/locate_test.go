package locate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// listed offers fixed files, as a symbol store or any source would.
type listed struct {
	name  string
	paths []string
	err   error
	calls atomic.Int64
	delay time.Duration
}

func (l *listed) Name() string { return l.name }

func (l *listed) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	l.calls.Add(1)
	if l.delay > 0 {
		time.Sleep(l.delay)
	}
	var out []Candidate
	for _, p := range l.paths {
		out = append(out, Candidate{Path: p})
	}
	return out, l.err
}

type fixtureSet struct {
	full, stripped, debug, symtabOnly string
	id                                frame.Identity
}

func fixtures(t *testing.T) fixtureSet {
	t.Helper()
	bin := testfixture.Build(t, testfixture.Spec{Name: "locate-hello", Lang: "c", Sources: []string{"elf/hello.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id"}})
	stripped, debug := testfixture.SplitDebug(t, bin, false)
	symtab := filepath.Join(t.TempDir(), "hello-symtab")
	testfixture.Run(t, testfixture.NeedTool(t, "objcopy"), "--strip-debug", bin, symtab)
	f, err := elfx.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return fixtureSet{full: bin, stripped: stripped, debug: debug, symtabOnly: symtab, id: buildid.Identify(f)}
}

func locateWith(t *testing.T, id frame.Identity, srcs ...Source) (Result, error) {
	t.Helper()
	return New(Options{Sources: srcs}).Locate(context.Background(), Query{ID: id})
}

func TestBestFileWins(t *testing.T) {
	fx := fixtures(t)
	id := frame.Identity{GNU: fx.id.GNU}
	for _, tc := range []struct {
		name       string
		offered    [][]string // per source, in order
		bin, debug string
	}{
		{"stripped paired with its debug file", [][]string{{fx.stripped}, {fx.debug}}, fx.stripped, fx.debug},
		{"unstripped beats an earlier stripped copy", [][]string{{fx.stripped}, {fx.full}}, fx.full, ""},
		{"debug file alone", [][]string{{fx.debug}}, "", fx.debug},
		{".symtab binary paired with DWARF", [][]string{{fx.symtabOnly}, {fx.debug}}, fx.symtabOnly, fx.debug},
		{"equal files: the earlier source", [][]string{{fx.full}, {copyOf(t, fx.full)}}, fx.full, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srcs []Source
			for i, p := range tc.offered {
				srcs = append(srcs, &listed{name: fmt.Sprint("s", i), paths: p})
			}
			res, err := locateWith(t, id, srcs...)
			bin, debug := res.Paths()
			if err != nil || bin != tc.bin || debug != tc.debug {
				t.Errorf("got bin %q debug %q (%v), want %q %q", bin, debug, err, tc.bin, tc.debug)
			}
		})
	}
	// Once DWARF is found, later sources (downloads) are not asked.
	later := &listed{name: "later", paths: []string{fx.debug}}
	locateWith(t, id, &listed{name: "first", paths: []string{fx.full}}, later)
	if later.calls.Load() != 0 {
		t.Error("a source after a DWARF answer was asked")
	}
}

func copyOf(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(p))
	os.WriteFile(out, b, 0o755)
	return out
}

func TestIdentityChecked(t *testing.T) {
	fx := fixtures(t)
	other := testfixture.Build(t, testfixture.Spec{Name: "locate-hello-other", Lang: "c", Sources: []string{"elf/hello.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id", "-DOTHER_BUILD=1"}})
	_, err := locateWith(t, frame.Identity{GNU: fx.id.GNU}, &listed{name: "s", paths: []string{other}})
	if !errors.Is(err, frame.ErrBuildIDMismatch) {
		t.Errorf("another build: %v", err)
	}
	// A binary matched by htlhash; its debug file cannot be (htlhash is of
	// the binary's bytes).
	sf, _ := elfx.Open(fx.stripped)
	strippedHTL := buildid.Identify(sf).HTL
	sf.Close()
	res, err := locateWith(t, frame.Identity{HTL: strippedHTL}, &listed{name: "s", paths: []string{fx.stripped, fx.debug}})
	if err != nil || res.Bin == nil || res.Debug != nil {
		t.Errorf("htlhash: %+v %v", res, err)
	}
	// Not a regular file: refused before opening.
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := mkfifo(fifo); err == nil {
		_, err = locateWith(t, frame.Identity{GNU: fx.id.GNU}, &listed{name: "s", paths: []string{fifo}})
		if !errors.Is(err, frame.ErrInvalidPath) {
			t.Errorf("fifo: %v", err)
		}
	}
	if _, err := locateWith(t, frame.Identity{}); !errors.Is(err, frame.ErrNoMapping) {
		t.Errorf("no identity: %v", err)
	}
}

// Files over max_file_bytes are refused with limit_exceeded (a sparse
// 1 TiB file costs nothing to make).
func TestMaxFileBytes(t *testing.T) {
	fx := fixtures(t)
	huge := filepath.Join(t.TempDir(), "huge")
	f, _ := os.Create(huge)
	b, _ := os.ReadFile(fx.full)
	f.Write(b)
	f.Truncate(1 << 40)
	f.Close()
	c := New(Options{Sources: []Source{&listed{name: "s", paths: []string{huge}}}, MaxFileBytes: 1 << 30})
	_, err := c.Locate(context.Background(), Query{ID: frame.Identity{GNU: fx.id.GNU}})
	if !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("1 TiB file: %v", err)
	}
}

// Answers short of DWARF and failures expire; transient failures are not
// remembered; concurrent callers share one search.
func TestAnswerLifetimes(t *testing.T) {
	fx := fixtures(t)
	id := frame.Identity{GNU: fx.id.GNU}
	src := &listed{name: "s", paths: []string{fx.stripped}}
	c := New(Options{Sources: []Source{src}, NegativeTTL: 30 * time.Millisecond})
	ctx := context.Background()
	c.Locate(ctx, Query{ID: id})
	c.Locate(ctx, Query{ID: id})
	if n := src.calls.Load(); n != 1 {
		t.Fatalf("cached answer asked the source %d times", n)
	}
	src.paths = []string{fx.stripped, fx.debug}
	time.Sleep(40 * time.Millisecond)
	res, _ := c.Locate(ctx, Query{ID: id})
	if !res.Complete() || src.calls.Load() != 2 {
		t.Fatalf("after the TTL: %+v, %d calls", res, src.calls.Load())
	}
	time.Sleep(40 * time.Millisecond)
	c.Locate(ctx, Query{ID: id})
	if src.calls.Load() != 2 {
		t.Fatal("a complete answer expired")
	}

	flaky := &listed{name: "f", err: fmt.Errorf("server down: %w", frame.ErrFetchFailed)}
	c = New(Options{Sources: []Source{flaky}, NegativeTTL: time.Hour})
	for i := 0; i < 3; i++ {
		if _, err := c.Locate(ctx, Query{ID: id}); !errors.Is(err, frame.ErrFetchFailed) {
			t.Fatalf("flaky: %v", err)
		}
	}
	if flaky.calls.Load() != 3 {
		t.Errorf("a transient failure was remembered (%d calls)", flaky.calls.Load())
	}

	slow := &listed{name: "slow", paths: []string{fx.full}, delay: 50 * time.Millisecond}
	c = New(Options{Sources: []Source{slow}})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); c.Locate(ctx, Query{ID: id}) }()
	}
	wg.Wait()
	if slow.calls.Load() != 1 {
		t.Errorf("8 concurrent callers searched %d times", slow.calls.Load())
	}
}

// A file the chain opened to check it is handed over once, only while it
// is the same file version, and files it rejected are not kept open.
func TestTakeOpened(t *testing.T) {
	fx := fixtures(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	data, _ := os.ReadFile(fx.full)
	os.WriteFile(bin, data, 0o755)
	other := filepath.Join(dir, "other")
	os.WriteFile(other, data[:len(data)-1], 0o755) // a truncated copy: corrupt
	c := New(Options{Sources: []Source{&listed{name: "l", paths: []string{other, bin}}}})
	defer c.Close()
	res, err := c.Locate(context.Background(), Query{ID: fx.id})
	if err != nil || res.Bin == nil || res.Bin.Path != bin {
		t.Fatalf("Locate: %+v %v", res, err)
	}
	if f := c.TakeOpened(other); f != nil {
		f.Close()
		t.Error("a rejected file was kept open")
	}
	f := c.TakeOpened(bin)
	if f == nil {
		t.Fatal("the chosen file was not handed over")
	}
	if id := buildid.Identify(f); !fx.id.Matches(id) {
		t.Errorf("handed over %s", id.Key())
	}
	f.Close()
	if f := c.TakeOpened(bin); f != nil {
		t.Error("handed over twice")
	}
	// Changed since it was checked: not handed over.
	c.Forget(&Query{ID: fx.id})
	c.files.cache.Purge()
	if _, err := c.Locate(context.Background(), Query{ID: fx.id}); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	os.Chtimes(bin, future, future)
	if f := c.TakeOpened(bin); f != nil {
		f.Close()
		t.Error("handed over a file that changed since")
	}
}

// A source still fetching (frame.ErrPending) makes the answer pending: the
// files found so far are used, the reason is pending when there are none,
// and nothing is remembered, so the next query sees the fetched file.
func TestPendingNotRemembered(t *testing.T) {
	fx := fixtures(t)
	id := frame.Identity{GNU: fx.id.GNU}
	local := &listed{name: "local", paths: []string{fx.stripped}}
	fetch := &listed{name: "fetch", err: fmt.Errorf("downloading: %w", frame.ErrPending)}
	c := New(Options{Sources: []Source{local, fetch}, NegativeTTL: time.Hour})
	res, err := c.Locate(context.Background(), Query{ID: id})
	if bin, dbg := res.Paths(); err != nil || bin != fx.stripped || dbg != "" || !res.Pending {
		t.Fatalf("while fetching: %q %q pending %v (%v)", bin, dbg, res.Pending, err)
	}
	fetch.err, fetch.paths = nil, []string{fx.debug}
	res, err = c.Locate(context.Background(), Query{ID: id})
	if bin, dbg := res.Paths(); err != nil || bin != fx.stripped || dbg != fx.debug || res.Pending {
		t.Fatalf("fetched: %q %q pending %v (%v)", bin, dbg, res.Pending, err)
	}
	// Complete now: remembered.
	c.Locate(context.Background(), Query{ID: id})
	if n := fetch.calls.Load(); n != 2 {
		t.Errorf("fetching source asked %d times, want 2", n)
	}

	// Nothing found yet: the reason is pending (over any other), not remembered.
	bad := &listed{name: "bad", paths: []string{"/nonexistent/x"}}
	fetch = &listed{name: "fetch", err: fmt.Errorf("downloading: %w", frame.ErrPending)}
	c = New(Options{Sources: []Source{bad, fetch}, NegativeTTL: time.Hour})
	for i := range 2 {
		if _, err := c.Locate(context.Background(), Query{ID: id}); frame.Reason(err) != "pending" {
			t.Fatalf("query %d: %v, want pending", i, err)
		}
	}
	if n := fetch.calls.Load(); n != 2 {
		t.Errorf("a pending answer was remembered: %d calls", n)
	}
}

// copying is a store whose files arrive from far: a copy started by the
// first query runs apart from it (as symstore's does) and takes copyFor.
type copying struct {
	path    string
	copyFor time.Duration
	once    sync.Once
	done    chan struct{}
	gen     atomic.Uint64
}

func (c *copying) Name() string       { return SourceStore }
func (c *copying) Generation() uint64 { return c.gen.Load() }

func (c *copying) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	c.once.Do(func() {
		go func() { time.Sleep(c.copyFor); close(c.done) }()
	})
	select {
	case <-c.done:
		return []Candidate{{Path: c.path}}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("still copying: %w", frame.ErrTimeout)
	}
}

// A batch waits for a symbol store's copy at most fetch_wait, like a
// debuginfod download: it is told pending (not timeout, which would make
// the frame's reason wrong and be remembered), the copy goes on, and a
// later batch gets the file. Before, only the batch timeout (10 s) bound it.
func TestStoreWaitsFetchWait(t *testing.T) {
	fx := fixtures(t)
	store := &copying{path: fx.full, copyFor: 1500 * time.Millisecond, done: make(chan struct{})}
	src := Waiting(store, 200*time.Millisecond)
	if g, ok := src.(Generational); !ok || g.Generation() != 0 {
		t.Fatal("the wrapped store lost its generation")
	}
	c := New(Options{Sources: []Source{src}})
	start := time.Now()
	res, err := c.Locate(context.Background(), Query{ID: fx.id, Since: start})
	took := time.Since(start)
	if !res.Pending && !errors.Is(err, frame.ErrPending) {
		t.Fatalf("a copy in flight: %+v %v, want pending", res, err)
	}
	if took > time.Second {
		t.Errorf("waited %v for a copy, fetch_wait is 200ms", took)
	}
	<-store.done
	res, err = c.Locate(context.Background(), Query{ID: fx.id, Since: time.Now()})
	if bin, _ := res.Paths(); err != nil || bin != fx.full {
		t.Fatalf("after the copy: %+v %v", res, err)
	}
}
