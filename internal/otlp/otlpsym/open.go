package otlpsym

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize"
)

// openAll locates and opens the objects of a batch, MaxParallel at a time,
// bounded in time by Options.Timeout so a dead or slow source costs at most
// that per batch, and waiting for downloads and opening at most
// Options.FetchWait.
func (s *Symbolizer) openAll(ctx context.Context, need map[*objRef]bool) {
	if len(need) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	since := time.Now() // the fetch wait runs from here (Options.FetchWait)
	for o := range need {
		o.q.Since = since
	}
	ch := make(chan *objRef)
	var wg sync.WaitGroup
	for range min(s.opt.MaxParallel, len(need)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				if ctx.Err() != nil {
					o.err = fmt.Errorf("%s: %w: %v", o.key, frame.ErrTimeout, ctx.Err())
					continue
				}
				o.h, o.err = s.open(ctx, o)
			}
		}()
	}
	for o := range need {
		ch <- o
	}
	close(ch)
	wg.Wait()
}

// open opens an object: from its symbol index when the store has one,
// else from its files, which it then indexes if it got the store's lease.
func (s *Symbolizer) open(ctx context.Context, o *objRef) (*symbolize.Handle, error) {
	if s.idx == nil || o.q.ID.GNU == "" {
		h, _, _, err := s.openFiles(ctx, o)
		return h, err
	}
	id := o.q.ID.GNU
	h, lease, err := s.idx.take(ctx, id, o.q.Since.Add(s.opt.fetchWait()))
	if h != nil {
		// An index is only written from files with DWARF.
		o.complete = true
		return h, nil
	}
	if err != nil {
		return nil, err
	}
	h, bin, dbg, err := s.openFiles(ctx, o)
	if lease != nil {
		switch {
		case err == nil && o.complete && !o.pending:
			s.idx.build(id, bin, dbg, lease)
		case err != nil && frame.Transient(err), o.pending:
			lease() // the files may come whole soon: ask again then
		default:
			// Nothing to index (no file, no DWARF): the store is not
			// asked about this id again until negative_ttl, or until the
			// sources gain files.
			lease()
			s.idx.skipFor(id, s.idx.ttl)
		}
	}
	return h, err
}

// openFiles locates an object's files and opens them. Files that vanished
// since they were located (a process exited) are located again, once.
func (s *Symbolizer) openFiles(ctx context.Context, o *objRef) (h *symbolize.Handle, bin, dbg string, err error) {
	for attempt := 0; ; attempt++ {
		res, err := s.chain.Locate(ctx, o.q)
		if err != nil {
			return nil, "", "", err
		}
		o.complete, o.pending = res.Complete(), res.Pending
		bin, dbg := res.Paths()
		// Opening (DWARF to index, sections to inflate) is waited for as
		// long as downloads are; it goes on in the engine past that.
		wctx, cancel := context.WithDeadline(ctx, o.q.Since.Add(s.opt.fetchWait()))
		h, err := s.engine.Open(wctx, bin, dbg)
		cancel()
		if err != nil && attempt == 0 && frame.Reason(err) == frame.ErrNotFound.Error() {
			s.chain.Forget(&o.q)
			continue
		}
		return h, bin, dbg, err
	}
}
