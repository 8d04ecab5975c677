package symstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// magicIndexFile is indexFile with the index magic in front, as the owner
// wants over HTTP.
func magicIndexFile(t testing.TB, n int) (string, []byte) {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	copy(data, indexMagic)
	p := filepath.Join(t.TempDir(), "index")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, data
}

// indexOwner is the Helm chart's default layout: one owner store (a real
// directory store behind its real handler) and gateway stores reading it
// over Remote.
type indexOwner struct {
	store *Store
	srv   *httptest.Server
	dir   string
	obs   *countObs
}

func newIndexOwner(t *testing.T, lease time.Duration, maxIndex int64) *indexOwner {
	t.Helper()
	dir := t.TempDir()
	be, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	obs := &countObs{}
	s, err := New(context.Background(), Config{Backend: be, Lease: lease, MaxIndexBytes: maxIndex, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &indexOwner{store: s, srv: srv, dir: dir, obs: obs}
}

func (o *indexOwner) gateway(t *testing.T, lease time.Duration) *Store {
	t.Helper()
	r, err := NewRemote(o.srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), Config{Backend: r, ScratchDir: t.TempDir(), Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// request sends one raw request to the owner.
func (o *indexOwner) request(t *testing.T, method, path string, body io.Reader, size int64, lease string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, o.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.ContentLength = size
	}
	if lease != "" {
		req.Header.Set(HeaderLease, lease)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func heldToken(s *Store, id string) string {
	k, _ := GNUKey(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.indexLeases[k].token
}

// Two gateways over one owner share its indexes: one builds under the
// owner's lease, renewed past its duration while held, the other waits;
// the index stored through the first is on the owner's disk and read back
// through the second with the same bytes; the owner refuses bodies without
// the lease, over max_index_bytes or not an index; the debuginfod routes
// still reach no index.
func TestIndexRemote(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	owner := newIndexOwner(t, lease, 64<<10)
	a, b := owner.gateway(t, lease), owner.gateway(t, lease)
	id := randomID(t)
	path := PathIndex + "/" + id

	if _, err := b.LocateIndex(ctx, id); !errors.Is(err, frame.ErrNotFound) {
		t.Fatalf("absent index over Remote: %v, want not_found", err)
	}
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		if code, _ := owner.request(t, m, path, nil, 0, ""); code != http.StatusNotFound {
			t.Errorf("%s of an unknown index: %d, want 404", m, code)
		}
	}

	held, releaseA, err := a.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("A: LeaseIndex = %v %v", held, err)
	}
	tok := heldToken(a, id)
	if tok == "" {
		t.Fatal("A keeps no token")
	}
	if h, r, err := b.LeaseIndex(ctx, id); err != nil || h {
		t.Fatalf("B while A holds: %v %v", h, err)
	} else {
		r()
	}
	if h, r, err := a.LeaseIndex(ctx, id); err != nil || h {
		t.Fatalf("A again while it holds: %v %v", h, err)
	} else {
		r()
	}
	// The agents' upload lease of the same id is apart, and its query
	// answers as before.
	if up, err := owner.store.Missing(ctx, []string{id}, true); err != nil || len(up.Upload) != 1 || up.Kind != "" {
		t.Errorf("upload lease while the index lease is held: %+v %v", up, err)
	}
	// Renewed over HTTP: well past the owner's lease it is still A's.
	time.Sleep(4 * lease)
	if h, r, _ := b.LeaseIndex(ctx, id); h {
		r()
		t.Fatal("A's lease expired at the owner: not renewed")
	}

	// The owner refuses what is not A's index.
	good, data := magicIndexFile(t, 10_000)
	for name, tc := range map[string]struct {
		body  []byte
		size  int64
		token string
		want  int
	}{
		"no lease":       {data, int64(len(data)), "", http.StatusConflict},
		"wrong lease":    {data, int64(len(data)), "0123456789abcdef01234567", http.StatusConflict},
		"long token":     {data, int64(len(data)), strings.Repeat("a", 65), http.StatusBadRequest},
		"not an index":   {bytes.Repeat([]byte("x"), 100), 100, tok, http.StatusBadRequest},
		"short":          {[]byte("PSYM"), 4, tok, http.StatusBadRequest},
		"declared large": {make([]byte, 64<<10+1), 64<<10 + 1, tok, http.StatusRequestEntityTooLarge},
		"streamed large": {append([]byte(indexMagic), make([]byte, 64<<10)...), -1, tok, http.StatusRequestEntityTooLarge},
	} {
		code, msg := owner.request(t, http.MethodPut, path, bytes.NewReader(tc.body), tc.size, tc.token)
		if code != tc.want {
			t.Errorf("%s: PUT %d %q, want %d", name, code, msg, tc.want)
		}
	}
	if code, _ := owner.request(t, http.MethodPut, PathIndex+"/nothex", bytes.NewReader(data), int64(len(data)), tok); code != http.StatusBadRequest {
		t.Errorf("PUT under a bad id: %d, want 400", code)
	}
	if code, _ := owner.request(t, http.MethodPut, PathIndex+"/..%2F..%2Fetc", bytes.NewReader(data), int64(len(data)), tok); code != http.StatusBadRequest {
		t.Errorf("PUT under an escaped path: %d, want 400", code)
	}
	if owner.store.Has(id, SymIndex) {
		t.Fatal("a refused body was stored")
	}
	// A refused body leaves A's lease A's.
	if h, r, _ := b.LeaseIndex(ctx, id); h {
		r()
		t.Fatal("a refused PUT let A's lease go")
	}

	gen := a.Generation()
	if err := a.PutIndex(ctx, id, good); err != nil {
		t.Fatal(err)
	}
	gone(t, good)
	if !a.Has(id, SymIndex) || a.Generation() == gen {
		t.Error("A does not know the index it stored")
	}
	if got, err := os.ReadFile(filepath.Join(owner.dir, "buildid", id, "symindex")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("owner's file: %d bytes, %v", len(got), err)
	}
	releaseA()
	releaseA()
	wantIndex(t, b, id, data)
	wantIndex(t, a, id, data)
	if h, r, err := b.LeaseIndex(ctx, id); err != nil || h {
		t.Errorf("B after the index is stored: %v %v", h, err)
	} else {
		r()
	}
	// Stored once: another gateway's copy is deduplicated (200).
	again, _ := magicIndexFile(t, 500)
	if err := b.PutIndex(ctx, id, again); err != nil {
		t.Fatal(err)
	}
	gone(t, again)
	if code, _ := owner.request(t, http.MethodPut, path, bytes.NewReader(data), int64(len(data)), "0123456789abcdef01234567"); code != http.StatusOK {
		t.Errorf("PUT of a stored index: %d, want 200", code)
	}
	if got, _ := os.ReadFile(filepath.Join(owner.dir, "buildid", id, "symindex")); !bytes.Equal(got, data) {
		t.Error("the stored index changed")
	}
	if owner.obs.get("stored") != 1 {
		t.Errorf("owner stored %d indexes", owner.obs.get("stored"))
	}

	// The debuginfod routes still reach no index: reads 404, writes 400.
	for m, want := range map[string]int{http.MethodGet: 404, http.MethodHead: 404, http.MethodPut: 400} {
		if code, _ := owner.request(t, m, "/buildid/"+id+"/symindex", bytes.NewReader(data), int64(len(data)), ""); code != want {
			t.Errorf("%s /buildid/ID/symindex: %d, want %d", m, code, want)
		}
	}
	if code, _ := owner.request(t, http.MethodPost, PathMissing, strings.NewReader(`{"build_ids":["`+id+`"],"kind":"source"}`), -1, ""); code != http.StatusBadRequest {
		t.Errorf("query of an unknown kind: %d, want 400", code)
	}
	if code, _ := owner.request(t, http.MethodPost, PathMissing, strings.NewReader(`{"build_ids":["gobuildid/00"],"kind":"symindex"}`), -1, ""); code != http.StatusBadRequest {
		t.Errorf("index query by Go build id: %d, want 400", code)
	}
}

// Released without storing, the lease is free at once for another gateway
// (not after it expires); an index put without a lease is taken while
// nobody holds one and refused while another gateway does.
func TestIndexRemoteRelease(t *testing.T) {
	ctx := context.Background()
	owner := newIndexOwner(t, time.Hour, 0)
	a, b := owner.gateway(t, time.Hour), owner.gateway(t, time.Hour)

	id := randomID(t)
	held, release, err := a.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("A: %v %v", held, err)
	}
	release()
	release()
	if heldToken(a, id) != "" {
		t.Error("A still keeps the token")
	}
	held, releaseB, err := b.LeaseIndex(ctx, id)
	if err != nil || !held {
		t.Fatalf("B after A gave up: %v %v", held, err)
	}
	// B holds it: A's index is refused and its file kept for the caller.
	p, _ := magicIndexFile(t, 100)
	var se *StatusError
	if err := a.PutIndex(ctx, id, p); !errors.As(err, &se) || se.Status != http.StatusConflict {
		t.Errorf("A's PutIndex while B holds the lease: %v, want 409", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the refused index file is gone: %v", err)
	}
	releaseB()

	id2 := randomID(t)
	p2, data := magicIndexFile(t, 100)
	if err := a.PutIndex(ctx, id2, p2); err != nil {
		t.Fatalf("PutIndex without a lease nobody holds: %v", err)
	}
	wantIndex(t, b, id2, data)
	owner.store.mu.Lock()
	n := len(owner.store.indexLeases)
	owner.store.mu.Unlock()
	if n != 0 {
		t.Errorf("%d index leases left at the owner", n)
	}
}
