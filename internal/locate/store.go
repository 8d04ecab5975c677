package locate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// Locator is what a symbol store extension offers in process: the stored
// files of a GNU build id as local paths (either may be empty), or an error
// wrapping frame.ErrNotFound.
type Locator interface {
	Locate(ctx context.Context, buildID string) (binPath, debugPath string, err error)
}

// IndexStore keeps compiled symbol indexes by GNU build id (a symbol store).
// A gateway compiles a binary's debug info once and stores the index, so
// other gateways over the same store read it instead of parsing DWARF; the
// lease keeps replicas from compiling one build at once.
type IndexStore interface {
	// LocateIndex returns a local path holding buildID's stored index, or an error wrapping frame.ErrNotFound.
	LocateIndex(ctx context.Context, buildID string) (string, error)
	// LeaseIndex asks to build buildID's index. held: the caller builds it, calls PutIndex, then release. !held: another builder (this process or another store over the same backend) holds it; look for the index again later. release is never nil and may be called more than once. While held, the lease is renewed in the background until release.
	LeaseIndex(ctx context.Context, buildID string) (held bool, release func(), err error)
	// PutIndex stores the index file at path for buildID. The store may move or remove path.
	PutIndex(ctx context.Context, buildID, path string) error
}

// Generational is implemented by sources whose contents grow while the
// collector runs (a symbol store receiving uploads). When the generation
// moves, answers short of DWARF are looked up again at once instead of
// waiting for NegativeTTL.
type Generational interface {
	Generation() uint64
}

// Store adapts a symbol store's Locator to a Source.
func Store(l Locator) Source { return storeSource{l} }

type storeSource struct{ l Locator }

func (storeSource) Name() string { return SourceStore }

func (s storeSource) Generation() uint64 {
	if g, ok := s.l.(Generational); ok {
		return g.Generation()
	}
	return 0
}

func (s storeSource) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	if q.ID.GNU == "" {
		return nil, nil
	}
	bin, dbg, err := s.l.Locate(ctx, q.ID.GNU) // validated hex
	if err != nil {
		if errors.Is(err, frame.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	var out []Candidate
	for _, p := range []string{bin, dbg} {
		if p != "" {
			out = append(out, Candidate{Path: p})
		}
	}
	return out, nil
}

// Waiting bounds how long a query waits on src, a source whose files may be
// copied from far (a symbol store over S3, or another collector's store):
// past wait from the query's Since its answer is frame.ErrPending, as a
// debuginfod download's is. The source must go on copying without the
// caller (the symbol store does), so a later query gets the file. Zero
// wait: as long as the caller's context allows.
func Waiting(src Source, wait time.Duration) Source {
	if src == nil || wait <= 0 {
		return src
	}
	return waiting{src, wait}
}

type waiting struct {
	Source
	wait time.Duration
}

func (w waiting) Generation() uint64 {
	if g, ok := w.Source.(Generational); ok {
		return g.Generation()
	}
	return 0
}

func (w waiting) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	if q.Since.IsZero() {
		return w.Source.Find(ctx, q)
	}
	wctx, cancel := context.WithDeadline(ctx, q.Since.Add(w.wait))
	defer cancel()
	c, err := w.Source.Find(wctx, q)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		return c, fmt.Errorf("%s: %w: not answered within %v (%v)", w.Name(), frame.ErrPending, w.wait, err)
	}
	return c, err
}
