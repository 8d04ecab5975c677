package otlpsym

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/testfixture"
)

// growingStore is a symbol store that receives the debug file while the
// collector runs, like the symbolstore extension after an agent's upload.
type growingStore struct {
	debug string
	has   atomic.Bool
	gen   atomic.Uint64
}

func (g *growingStore) Locate(_ context.Context, id string) (string, string, error) {
	if !g.has.Load() {
		return "", "", fmt.Errorf("%s: %w", id, frame.ErrNotFound)
	}
	return "", g.debug, nil
}

func (g *growingStore) Generation() uint64 { return g.gen.Load() }

// A frame that failed before the upload is named in the next batch after
// it, not served as a failure from the result cache.
func TestStoreUploadRetriesFailedFrames(t *testing.T) {
	bin := fixture(t, "storegrow")
	_, debug := testfixture.SplitDebug(t, bin, false)
	addr := inside(t, bin, "main")
	store := &growingStore{debug: debug}
	opt := defaults()
	opt.NegativeTTL = time.Hour // the store's generation, not a TTL, brings the retry
	opt.Locate = locate.Config{Order: []string{locate.SourceStore}, Store: locate.Store(store)}
	s := newSym(t, opt)
	batch := func() (string, []string) {
		pd, locs := rawProfile(rawFrame{file: "/nonexistent/storegrow", ids: fileIDs{gnu: idsOf(t, bin).gnu}, addr: addr})
		s.Profiles(context.Background(), pd)
		return reasonOf(pd, locs[0]), names(pd, locs[0])
	}
	if r, n := batch(); r != "no_debug_info" || len(n) != 0 {
		t.Fatalf("before upload: %q %v", r, n)
	}
	if r, _ := batch(); r != "no_debug_info" {
		t.Fatalf("cached failure: %q", r)
	}
	store.has.Store(true)
	store.gen.Add(1)
	if r, n := batch(); r != "" || len(n) == 0 || n[len(n)-1] != "main" {
		t.Fatalf("after upload: %q %v", r, n)
	}
}
