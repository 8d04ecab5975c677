package otlpsym

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/symbolize"
	"github.com/profsym/profsym/internal/symbolize/symindex"
)

// indexer shares the work of parsing debug info across the symbolizers of
// one symbol store (a gateway's replicas): an object with a GNU build id is
// opened from the store's symbol index when there is one; otherwise the
// symbolizer that gets the store's lease on the index parses the files and
// writes it, and the others wait for it as for a download (frames pending
// within FetchWait), then read the index. See docs/symbol-index.md.
type indexer struct {
	store  locate.IndexStore
	engine *symbolize.Resolver
	log    *zap.Logger
	tmp    string
	wait   time.Duration // poll interval while another builder works
	ttl    time.Duration // how long a build id that cannot be indexed is skipped

	gen func() uint64 // the chain's generation: moves when a store gains files

	mu       sync.Mutex
	skip     map[string]skipped // build ids to open from their files for now
	building map[string]bool    // built here now: opened from files meanwhile
	refused  map[string]int64   // refused indexes, by reason

	slots  chan struct{} // builds at once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	written, failed atomic.Int64
}

// maxSkipped bounds the build ids remembered as not indexable.
const maxSkipped = 1 << 14

// skipped is a build id opened from its files until a time, or until the
// sources gain files (an upload may bring the DWARF it lacked).
type skipped struct {
	until time.Time
	gen   uint64
}

func newIndexer(store locate.IndexStore, engine *symbolize.Resolver, gen func() uint64, opt *Options) *indexer {
	ctx, cancel := context.WithCancel(context.Background())
	return &indexer{
		store: store, engine: engine, gen: gen, log: opt.Logger, tmp: os.TempDir(),
		wait: 100 * time.Millisecond, ttl: opt.NegativeTTL,
		skip: map[string]skipped{}, building: map[string]bool{}, refused: map[string]int64{},
		slots: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
	}
}

// close stops the builds and waits for them.
func (ix *indexer) close() {
	ix.cancel()
	ix.wg.Wait()
}

func (ix *indexer) skipped(id string) bool {
	gen := ix.gen()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.building[id] {
		return true
	}
	sk, ok := ix.skip[id]
	if ok && (time.Now().After(sk.until) || sk.gen != gen) {
		delete(ix.skip, id)
		return false
	}
	return ok
}

func (ix *indexer) skipFor(id string, d time.Duration) {
	gen := ix.gen()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if len(ix.skip) >= maxSkipped {
		clear(ix.skip)
	}
	ix.skip[id] = skipped{time.Now().Add(d), gen}
}

// take returns a handle on id's index, or says that this symbolizer should
// open the files and build the index (release non-nil: the lease, to pass
// to build), or that it should open the files without building (both nil).
// While another builder holds the lease it waits for the index until
// deadline, then fails with frame.ErrPending.
func (ix *indexer) take(ctx context.Context, id string, deadline time.Time) (h *symbolize.Handle, release func(), err error) {
	if ix.skipped(id) {
		return nil, nil, nil
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return nil, nil, nil
	}
	for {
		path, err := ix.store.LocateIndex(ctx, id)
		switch {
		case err == nil:
			h, err := ix.engine.OpenIndex(ctx, path, raw)
			if err == nil {
				return h, nil, nil
			}
			if frame.Transient(err) {
				return nil, nil, nil
			}
			ix.refuse(id, err)
			return nil, nil, nil
		case !errors.Is(err, frame.ErrNotFound):
			// The store does not answer: the files, as without an index.
			ix.log.Debug("symbol index: store", zap.String("build_id", id), zap.Error(err))
			return nil, nil, nil
		}
		held, release, err := ix.store.LeaseIndex(ctx, id)
		if err != nil {
			ix.log.Debug("symbol index: lease", zap.String("build_id", id), zap.Error(err))
			return nil, nil, nil
		}
		if held {
			// The builder before may have stored it and let the lease go
			// between the two questions: look once more, or it is parsed
			// twice.
			if path, err := ix.store.LocateIndex(ctx, id); err == nil {
				release()
				h, err := ix.engine.OpenIndex(ctx, path, raw)
				if err == nil {
					return h, nil, nil
				}
				if !frame.Transient(err) {
					ix.refuse(id, err)
				}
				return nil, nil, nil
			}
			return nil, release, nil
		}
		release()
		t := time.NewTimer(min(ix.wait, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, fmt.Errorf("%s: symbol index being built elsewhere: %w", id, frame.ErrPending)
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("%s: symbol index being built elsewhere: %w", id, frame.ErrPending)
		}
	}
}

// refuse counts an index that could not be used; the build id is opened
// from its files for a while (the stored index stays: the next format
// version, or an operator, replaces it).
func (ix *indexer) refuse(id string, err error) {
	reason := frame.Reason(err)
	switch {
	case errors.Is(err, symbolize.ErrIndexOptions):
		reason = "options"
	case errors.Is(err, symindex.ErrVersion):
		reason = "version"
	}
	ix.mu.Lock()
	ix.refused[reason]++
	ix.mu.Unlock()
	ix.log.Warn("symbol index refused; opening the files instead", zap.String("build_id", id), zap.String("reason", reason), zap.Error(err))
	ix.skipFor(id, ix.ttl)
}

// build compiles id's index from the object's files in the background and
// stores it, then lets the lease go.
func (ix *indexer) build(id, bin, debug string, release func()) {
	ix.mu.Lock()
	if ix.building[id] {
		ix.mu.Unlock()
		release()
		return
	}
	ix.building[id] = true
	ix.mu.Unlock()
	ix.wg.Add(1)
	go func() {
		defer ix.wg.Done()
		defer func() {
			release()
			ix.mu.Lock()
			delete(ix.building, id)
			ix.mu.Unlock()
		}()
		select {
		case ix.slots <- struct{}{}:
			defer func() { <-ix.slots }()
		case <-ix.ctx.Done():
			return
		}
		if err := ix.compile(id, bin, debug); err != nil {
			ix.failed.Add(1)
			ix.skipFor(id, ix.ttl)
			lvl := zap.WarnLevel
			if errors.Is(err, symbolize.ErrNotIndexable) {
				lvl = zap.DebugLevel
			}
			ix.log.Log(lvl, "symbol index not written", zap.String("build_id", id), zap.Error(err))
			return
		}
		ix.written.Add(1)
	}()
}

func (ix *indexer) compile(id, bin, debug string) error {
	ctx := ix.ctx
	h, err := ix.engine.Open(ctx, bin, debug)
	if err != nil {
		return err
	}
	defer h.Close()
	f, err := os.CreateTemp(ix.tmp, "profsym-symindex-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }() // a no-op once the store took it
	start := time.Now()
	st, err := h.WriteIndex(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := ix.store.PutIndex(ctx, id, f.Name()); err != nil {
		return err
	}
	ix.log.Info("symbol index written", zap.String("build_id", id), zap.Int("ranges", st.Ranges),
		zap.Int64("bytes", st.Bytes), zap.Duration("took", time.Since(start)))
	return nil
}

// IndexStats are the symbol index counters, cumulative.
type IndexStats struct {
	Parsed  int64            // objects whose debug info was parsed from files
	Opened  int64            // indexes opened
	Written int64            // indexes compiled and stored
	Failed  int64            // builds that did not end in a stored index
	Refused map[string]int64 // indexes not used, by reason
}

// IndexStats reports the symbol index counters; Parsed and Opened also
// count without a symbol store.
func (s *Symbolizer) IndexStats() IndexStats {
	st := IndexStats{Parsed: s.engine.Parsed(), Opened: s.engine.IndexesOpened(), Refused: map[string]int64{}}
	if ix := s.idx; ix != nil {
		st.Written, st.Failed = ix.written.Load(), ix.failed.Load()
		ix.mu.Lock()
		for k, v := range ix.refused {
			st.Refused[k] = v
		}
		ix.mu.Unlock()
	}
	return st
}
