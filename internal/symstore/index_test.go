package symstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// randomID is a GNU build id nobody stored: an index is opaque to the
// store, so no binary is needed.
func randomID(testing.TB) string {
	var b [20]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// indexFile writes n bytes of distinct content into a new file under dir
// (a temp dir when ""), as a builder would before PutIndex.
func indexFile(t testing.TB, dir string, n int) (string, []byte) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	data := make([]byte, n)
	rand.Read(data)
	f, err := os.CreateTemp(dir, "index-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name(), data
}

func wantIndex(t testing.TB, s *Store, id string, want []byte) {
	t.Helper()
	p, err := s.LocateIndex(context.Background(), id)
	if err != nil {
		t.Fatalf("LocateIndex(%s): %v", id, err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("LocateIndex(%s) = %s: %d bytes (%v), want %d", id, p, len(got), err, len(want))
	}
}

func gone(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after PutIndex: %v", path, err)
	}
}

// The index is a kind of its own that the debuginfod routes cannot reach
// either way.
func TestIndexKindNotInProtocol(t *testing.T) {
	if k, ok := ParseKind(string(SymIndex)); ok {
		t.Fatalf("ParseKind(symindex) = %q, true", k)
	}
	if _, ok := validKind(string(SymIndex)); !ok {
		t.Fatal("backends refuse symindex")
	}
	if kindBit(SymIndex)&(kindBit(DebugInfo)|kindBit(Executable)) != 0 {
		t.Fatal("symindex shares a bit with another kind")
	}
}

// A directory store: an index put is located with the same bytes, counted,
// kept once, listed by a store opened later, and neither served nor taken
// on the debuginfod routes; bad files are refused.
func TestIndexDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	be, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countObs{}
	s, err := New(ctx, Config{Backend: be, Observer: obs, MaxIndexBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	id := randomID(t)

	if _, err := s.LocateIndex(ctx, id); !errors.Is(err, frame.ErrNotFound) {
		t.Fatalf("missing index: %v, want not_found", err)
	}
	if _, err := s.LocateIndex(ctx, "../../etc"); !errors.Is(err, frame.ErrInvalidBuildID) {
		t.Errorf("path-like id: %v", err)
	}
	if err := s.PutIndex(ctx, "gobuildid/00", "/dev/null"); !errors.Is(err, frame.ErrInvalidBuildID) {
		t.Errorf("PutIndex of a non-GNU key: %v", err)
	}

	gen := s.Generation()
	path, data := indexFile(t, "", 10_000)
	if err := s.PutIndex(ctx, id, path); err != nil {
		t.Fatal(err)
	}
	gone(t, path)
	wantIndex(t, s, id, data)
	if s.Generation() == gen {
		t.Error("generation did not move")
	}
	if n, b := s.Size(); n != 1 || b != int64(len(data)) {
		t.Errorf("Size = %d, %d", n, b)
	}
	if obs.get("stored") != 1 || obs.get("served") != 1 {
		t.Errorf("counters %v", obs.m)
	}
	if st, err := os.Lstat(filepath.Join(dir, "buildid", id, "symindex")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("stored file: %v", err)
	}
	if s.Has(id, DebugInfo) || s.Has(id, Executable) {
		t.Error("an index counts as a debug file")
	}
	if _, _, err := s.Locate(ctx, id); !errors.Is(err, frame.ErrNotFound) {
		t.Errorf("Locate of an id with only an index: %v", err)
	}

	// Kept once: a second put keeps the stored one and removes its file.
	path2, _ := indexFile(t, "", 500)
	if err := s.PutIndex(ctx, id, path2); err != nil {
		t.Fatal(err)
	}
	gone(t, path2)
	wantIndex(t, s, id, data)
	if obs.get("stored") != 1 || obs.get("deduped") != 1 {
		t.Errorf("counters %v", obs.m)
	}

	// The debuginfod routes reach neither side: reads of a kind outside
	// the protocol are 404 (as debuginfod's /source), writes 400.
	for m, want := range map[string]int{http.MethodGet: 404, http.MethodHead: 404, http.MethodPut: 400, http.MethodPost: 400} {
		req, _ := http.NewRequest(m, srv.URL+"/buildid/"+id+"/symindex", bytes.NewReader([]byte("x")))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || bytes.Contains(body, data[:64]) {
			t.Errorf("%s symindex over HTTP: %d, want %d", m, resp.StatusCode, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "buildid", id, "symindex")); !bytes.Equal(b, data) {
		t.Error("the stored index changed")
	}

	// A store opened later lists it.
	s2, err := New(ctx, Config{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Has(id, SymIndex) {
		t.Error("relist lost the index")
	}
	if n, b := s2.Size(); n != 1 || b != int64(len(data)) {
		t.Errorf("relisted Size = %d, %d", n, b)
	}
	wantIndex(t, s2, id, data)

	t.Run("too large", func(t *testing.T) {
		id := randomID(t)
		path, _ := indexFile(t, "", 64<<10+1)
		if err := s.PutIndex(ctx, id, path); !errors.Is(err, frame.ErrLimitExceeded) {
			t.Fatalf("oversized index: %v, want limit_exceeded", err)
		}
		if s.Has(id, SymIndex) {
			t.Error("stored")
		}
		if _, err := os.Stat(filepath.Join(dir, "buildid", id)); err == nil {
			t.Error("oversized index reached the store")
		}
	})
	t.Run("symlink", func(t *testing.T) {
		id := randomID(t)
		target, _ := indexFile(t, "", 100)
		link := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if err := s.PutIndex(ctx, id, link); err == nil {
			t.Fatal("a symlink was stored")
		}
		if _, err := s.LocateIndex(ctx, id); !errors.Is(err, frame.ErrNotFound) {
			t.Errorf("after a refused symlink: %v", err)
		}
		if _, err := os.Stat(target); err != nil {
			t.Errorf("the symlink's target was touched: %v", err)
		}
	})
	t.Run("not a file", func(t *testing.T) {
		if err := s.PutIndex(ctx, randomID(t), t.TempDir()); err == nil {
			t.Fatal("a directory was stored")
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if err := s.PutIndex(ctx, randomID(t), filepath.Join(t.TempDir(), "none")); err == nil {
			t.Fatal("no error for a missing file")
		}
	})
	if after := storedFiles(t, filepath.Join(dir, ".tmp")); len(after) != 0 {
		t.Errorf("temp files left: %v", after)
	}
}

// Indexes count against max_objects like any file.
func TestIndexStoreFull(t *testing.T) {
	ctx := context.Background()
	be, _ := NewDir(t.TempDir())
	obs := &countObs{}
	s, err := New(ctx, Config{Backend: be, MaxObjects: 1, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := indexFile(t, "", 100)
	if err := s.PutIndex(ctx, randomID(t), p1); err != nil {
		t.Fatal(err)
	}
	p2, _ := indexFile(t, "", 100)
	var re *RejectError
	if err := s.PutIndex(ctx, randomID(t), p2); !errors.As(err, &re) || re.Reason != ReasonStoreFull {
		t.Fatalf("second index over max_objects 1: %v", err)
	}
	if obs.get("rejected:store_full") != 1 {
		t.Errorf("counters %v", obs.m)
	}
	if n, _ := s.Size(); n != 1 {
		t.Errorf("%d objects", n)
	}
}

// An index built in a directory on another file system than the store
// (the rename fails with EXDEV) is copied in; so is one staged in a
// scratch directory on another file system.
func TestIndexAcrossFileSystems(t *testing.T) {
	other, err := os.MkdirTemp("/dev/shm", "symstore-test-") //nolint:usetesting // another file system than t.TempDir's
	if err != nil {
		testfixture.SkipOrFail(t, "no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	dir := t.TempDir()
	if sameDevice(t, dir, other) {
		testfixture.SkipOrFail(t, "%s and %s are on one file system", dir, other)
	}
	ctx := context.Background()
	be, _ := NewDir(dir)
	for _, scratch := range []string{"", filepath.Join(other, "scratch")} {
		s, err := New(ctx, Config{Backend: be, ScratchDir: scratch})
		if err != nil {
			t.Fatal(err)
		}
		id := randomID(t)
		path, data := indexFile(t, other, 3000)
		if err := s.PutIndex(ctx, id, path); err != nil {
			t.Fatalf("scratch %q: %v", scratch, err)
		}
		gone(t, path)
		wantIndex(t, s, id, data)
		if left := storedFiles(t, other); len(left) != 0 {
			t.Errorf("scratch %q: files left on the other file system: %v", scratch, left)
		}
	}
}

// The in-memory index lease: one builder at a time, renewed while held,
// apart from the upload lease of the same id, free again after release
// (idempotent), and not handed out once the index is stored.
func TestIndexLeaseInMemory(t *testing.T) {
	ctx := context.Background()
	be, _ := NewDir(t.TempDir())
	s, err := New(ctx, Config{Backend: be, Lease: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	id := randomID(t)

	// An agent's upload lease does not block the index lease...
	up, err := s.Missing(ctx, []string{id}, true)
	if err != nil || len(up.Upload) != 1 {
		t.Fatalf("upload lease: %+v %v", up, err)
	}
	held, release, err := s.LeaseIndex(ctx, id)
	if err != nil || !held || release == nil {
		t.Fatalf("LeaseIndex = %v %v", held, err)
	}
	// ... nor the index lease an upload lease.
	if again, _ := s.Missing(ctx, []string{id}, true); len(again.Pending) != 1 {
		t.Errorf("the upload lease is no longer held: %+v", again)
	}
	s.release(gnuKey(t, id), up.Upload[0].Token)
	if again, _ := s.Missing(ctx, []string{id}, true); len(again.Upload) != 1 {
		t.Errorf("the index lease blocks uploads: %+v", again)
	}

	if h2, r2, err := s.LeaseIndex(ctx, id); err != nil || h2 || r2 == nil {
		t.Fatalf("second LeaseIndex = %v %v, want not held", h2, err)
	} else {
		r2()
	}
	// Renewed: well past the lease duration it is still held.
	time.Sleep(500 * time.Millisecond)
	if h2, _, _ := s.LeaseIndex(ctx, id); h2 {
		t.Fatal("the held lease expired: not renewed")
	}
	release()
	release()
	held, release, err = s.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("after release: %v %v", held, err)
	}
	path, data := indexFile(t, "", 100)
	if err := s.PutIndex(ctx, id, path); err != nil {
		t.Fatal(err)
	}
	release()
	if h, r, err := s.LeaseIndex(ctx, id); err != nil || h || r == nil {
		t.Errorf("LeaseIndex of a stored index = %v %v", h, err)
	}
	wantIndex(t, s, id, data)
	s.mu.Lock()
	n := len(s.indexLeases)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d index leases left", n)
	}
	if _, _, err := s.LeaseIndex(ctx, "nothex"); err == nil {
		t.Error("a bad id was leased")
	}
}

// Over one bucket: an index put by one replica is located by another
// (copied into its cache), listed by a third; the index lease is handed
// out once across replicas, renewed while held, in its own lease object
// apart from the upload lease; a reader refuses a remote index over its
// max_index_bytes.
func TestIndexS3(t *testing.T) {
	srv := testfixture.StartS3(t)
	if !srv.Conditional {
		testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
	}
	ctx := context.Background()
	r := twoReplicas(t, srv, "indexes", 600*time.Millisecond)
	a, b := r.stores[0], r.stores[1]
	id := randomID(t)

	if _, err := b.LocateIndex(ctx, id); !errors.Is(err, frame.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}

	held, release, err := a.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("A: %v %v", held, err)
	}
	leases := filepath.Join(srv.Dir, "indexes", "leases")
	if objs := regularFiles(leases); len(objs) != 1 || !strings.HasSuffix(objs[0], filepath.Join("leases", "symindex", "buildid", id)) {
		t.Errorf("lease objects while A builds: %v", objs)
	}
	if h, rb, err := b.LeaseIndex(ctx, id); err != nil || h {
		t.Fatalf("B while A holds: %v %v", h, err)
	} else {
		rb()
		rb()
	}
	// The upload lease of the same id is another object.
	up, err := b.Missing(ctx, []string{id}, true)
	if err != nil || len(up.Upload) != 1 {
		t.Fatalf("upload lease while the index lease is held: %+v %v", up, err)
	}
	if objs := regularFiles(leases); len(objs) != 2 {
		t.Errorf("lease objects: %v, want the index's and the upload's", objs)
	}
	// Renewed by A's goroutine well past its duration.
	time.Sleep(1500 * time.Millisecond)
	if h, _, err := b.LeaseIndex(ctx, id); err != nil || h {
		t.Fatalf("B after A's lease duration: %v %v; not renewed", h, err)
	}
	release()
	release()
	b.release(gnuKey(t, id), up.Upload[0].Token)
	if objs := regularFiles(leases); len(objs) != 0 {
		t.Errorf("lease objects after release: %v", objs)
	}

	held, releaseB, err := b.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("B after A released: %v %v", held, err)
	}
	path, data := indexFile(t, "", 20_000)
	if err := b.PutIndex(ctx, id, path); err != nil {
		t.Fatal(err)
	}
	releaseB()
	gone(t, path)
	if objs := regularFiles(filepath.Join(srv.Dir, "indexes", "buildid")); len(objs) != 1 || filepath.Base(objs[0]) != "symindex" {
		t.Errorf("bucket holds %v", objs)
	}
	// A learns of it from the bucket, copies it into its cache.
	wantIndex(t, a, id, data)
	if h, _, err := a.LeaseIndex(ctx, id); err != nil || h {
		t.Errorf("LeaseIndex of a stored index: %v %v", h, err)
	}
	// A second put through A keeps B's.
	p2, _ := indexFile(t, "", 10)
	if err := a.PutIndex(ctx, id, p2); err != nil {
		t.Fatal(err)
	}
	gone(t, p2)
	wantIndex(t, a, id, data)
	if r.obs.get("stored") != 1 || r.obs.get("deduped") != 1 {
		t.Errorf("counters %v", r.obs.m)
	}

	// A third replica lists it at start; one with a lower bound refuses to
	// fetch it.
	be, err := NewS3(ctx, S3Config{Endpoint: srv.Endpoint, Bucket: "indexes", AccessKeyID: srv.Access, SecretAccessKey: srv.Secret, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ctx, Config{Backend: be, ScratchDir: t.TempDir(), Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Has(id, SymIndex) {
		t.Error("a new replica does not list the index")
	}
	wantIndex(t, c, id, data)
	small, err := New(ctx, Config{Backend: be, ScratchDir: t.TempDir(), MaxIndexBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.LocateIndex(ctx, id); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("index over max_index_bytes: %v, want limit_exceeded", err)
	}
	big, _ := indexFile(t, "", 1001)
	if err := small.PutIndex(ctx, randomID(t), big); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("put over max_index_bytes: %v", err)
	}
}

// An upload lease held over the bucket does not block the index lease.
func TestIndexS3UploadLeaseFirst(t *testing.T) {
	srv := testfixture.StartS3(t)
	if !srv.Conditional {
		testfixture.SkipOrFail(t, "versitygw needs user extended attributes under %s for conditional writes", os.TempDir())
	}
	ctx := context.Background()
	r := twoReplicas(t, srv, "uploadfirst", 5*time.Second)
	id := randomID(t)
	up, err := r.stores[0].Missing(ctx, []string{id}, true)
	if err != nil || len(up.Upload) != 1 {
		t.Fatalf("upload lease: %+v %v", up, err)
	}
	held, release, err := r.stores[1].LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("index lease while the upload lease is held: %v %v", held, err)
	}
	release()
	if again, _ := r.stores[1].Missing(ctx, []string{id}, true); len(again.Pending) != 1 {
		t.Errorf("releasing the index lease dropped the upload lease: %+v", again)
	}
	r.stores[0].release(gnuKey(t, id), up.Upload[0].Token)
}

func gnuKey(t testing.TB, id string) Key {
	t.Helper()
	k, err := GNUKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sameDevice reports whether a rename from b to a works, i.e. one file
// system.
func sameDevice(t testing.TB, a, b string) bool {
	t.Helper()
	p, _ := indexFile(t, b, 1)
	dst := filepath.Join(a, "probe-"+randomID(t))
	err := os.Rename(p, dst)
	os.Remove(p)
	os.Remove(dst)
	return err == nil
}
