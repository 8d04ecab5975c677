package otlpsym

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

// indexSetup is a binary known to a store by its debug file, and a real
// symbol store (a directory) that keeps indexes.
type indexSetup struct {
	bin, debug string
	id         string
	addr       uint64
	store      *symstore.Store
	files      *growingStore // where the debug file is found
	opt        Options
}

func newIndexSetup(t *testing.T, name string) *indexSetup {
	bin := fixture(t, name)
	_, debug := testfixture.SplitDebug(t, bin, false)
	dir, err := symstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st, err := symstore.New(context.Background(), symstore.Config{Backend: dir, Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	x := &indexSetup{bin: bin, debug: debug, id: idsOf(t, bin).gnu, addr: inside(t, bin, "main"), store: st}
	x.opt = defaults()
	files := &growingStore{debug: debug}
	files.has.Store(true)
	x.files = files
	x.opt.Locate = locate.Config{Order: []string{locate.SourceStore}, Store: locate.Store(files)}
	x.opt.Indexes = st
	x.opt.FetchWait = 200 * time.Millisecond
	return x
}

func (x *indexSetup) batch(s *Symbolizer) (string, []string) {
	pd, locs := rawProfile(rawFrame{file: "/nonexistent/" + filepath.Base(x.bin), ids: fileIDs{gnu: x.id}, addr: x.addr})
	s.Profiles(context.Background(), pd)
	return reasonOf(pd, locs[0]), names(pd, locs[0])
}

// waitIndex waits for the store to hold the index (a build runs after the
// batch that started it).
func (x *indexSetup) waitIndex(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := x.store.LocateIndex(context.Background(), x.id); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no index stored")
		}
	}
}

// Two symbolizers over one store: the first parses the debug file and
// writes the index, the second answers from the index alone, the same.
func TestIndexSharedThroughStore(t *testing.T) {
	x := newIndexSetup(t, "indexshared")
	want := engineNames(t, x.bin, x.addr)
	a := newSym(t, x.opt)
	if r, n := x.batch(a); r != "" || !reflect.DeepEqual(n, want) {
		t.Fatalf("first symbolizer: %q %v, want %v", r, n, want)
	}
	x.waitIndex(t)
	for deadline := time.Now().Add(10 * time.Second); a.IndexStats().Written == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if st := a.IndexStats(); st.Parsed != 1 || st.Written != 1 || st.Opened != 0 {
		t.Fatalf("first symbolizer: %+v, want 1 parsed, 1 written", st)
	}
	b := newSym(t, x.opt)
	if r, n := x.batch(b); r != "" || !reflect.DeepEqual(n, want) {
		t.Fatalf("second symbolizer: %q %v, want %v", r, n, want)
	}
	if st := b.IndexStats(); st.Parsed != 0 || st.Opened != 1 || st.Written != 0 {
		t.Fatalf("second symbolizer: %+v, want the index opened and nothing parsed", st)
	}
}

// While another builder holds the lease, frames are pending (not named
// from a parse of their own); once the index is there they are named
// from it.
func TestIndexWaitsForBuilder(t *testing.T) {
	x := newIndexSetup(t, "indexwait")
	held, release, err := x.store.LeaseIndex(context.Background(), x.id)
	if err != nil || !held {
		t.Fatalf("lease: %v %v", held, err)
	}
	s := newSym(t, x.opt)
	if r, n := x.batch(s); r != frame.ErrPending.Error() || len(n) != 0 {
		t.Fatalf("while another builds: %q %v, want pending", r, n)
	}
	if st := s.IndexStats(); st.Parsed != 0 {
		t.Fatalf("parsed while another builds: %+v", st)
	}
	// The other builder stores its index and lets go.
	r := symbolize.New(symbolize.DefaultOptions())
	defer r.Close()
	h, err := r.Open(context.Background(), "", x.debug)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "index")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteIndex(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	h.Close()
	f.Close()
	if err := x.store.PutIndex(context.Background(), x.id, f.Name()); err != nil {
		t.Fatal(err)
	}
	release()
	if r, n := x.batch(s); r != "" || !reflect.DeepEqual(n, engineNames(t, x.bin, x.addr)) {
		t.Fatalf("after the index: %q %v", r, n)
	}
	if st := s.IndexStats(); st.Parsed != 0 || st.Opened != 1 {
		t.Fatalf("after the index: %+v, want it opened, nothing parsed", st)
	}
}

// A damaged index in the store is refused with a reason and the frame is
// named from the debug file; no second index is written over it.
func TestIndexDamagedFallsBack(t *testing.T) {
	x := newIndexSetup(t, "indexdamaged")
	bad := filepath.Join(t.TempDir(), "bad")
	junk := make([]byte, 4096)
	copy(junk, "PSYMIDX\x00")
	os.WriteFile(bad, junk, 0o644)
	if err := x.store.PutIndex(context.Background(), x.id, bad); err != nil {
		t.Fatal(err)
	}
	s := newSym(t, x.opt)
	if r, n := x.batch(s); r != "" || !reflect.DeepEqual(n, engineNames(t, x.bin, x.addr)) {
		t.Fatalf("damaged index: %q %v", r, n)
	}
	st := s.IndexStats()
	if st.Refused["corrupt_file"] != 1 || st.Parsed != 1 || st.Opened != 0 {
		t.Fatalf("damaged index: %+v, want refused as corrupt_file and the files parsed", st)
	}
	time.Sleep(100 * time.Millisecond)
	if st := s.IndexStats(); st.Written != 0 {
		t.Fatalf("wrote over the stored index: %+v", st)
	}
}

// Closing a symbolizer stops its builds (goleak checks the package).
func TestIndexBuildStopsOnClose(t *testing.T) {
	x := newIndexSetup(t, "indexclose")
	s, err := New(x.opt)
	if err != nil {
		t.Fatal(err)
	}
	x.batch(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := x.store.LocateIndex(context.Background(), x.id); err != nil && !errors.Is(err, frame.ErrNotFound) {
		t.Fatal(err)
	}
}

// Frames seen before the debug file reached the store: once it arrives
// (the store's generation moves), the index is built from it at once,
// not after negative_ttl.
func TestIndexAfterUpload(t *testing.T) {
	x := newIndexSetup(t, "indexupload")
	x.files.has.Store(false)
	x.opt.NegativeTTL = time.Hour
	s := newSym(t, x.opt)
	if r, _ := x.batch(s); r != "no_debug_info" {
		t.Fatalf("before the upload: %q", r)
	}
	x.files.has.Store(true)
	x.files.gen.Add(1)
	if r, n := x.batch(s); r != "" || !reflect.DeepEqual(n, engineNames(t, x.bin, x.addr)) {
		t.Fatalf("after the upload: %q %v", r, n)
	}
	x.waitIndex(t)
}
