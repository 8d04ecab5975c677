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

// open locates an object's files and opens them. Files that vanished since
// they were located (a process exited) are located again, once.
func (s *Symbolizer) open(ctx context.Context, o *objRef) (*symbolize.Handle, error) {
	var lease func() // held: this symbolizer builds the object's index
	if s.idx != nil && o.q.ID.GNU != "" {
		h, release, err := s.idx.take(ctx, o.q.ID.GNU, o.q.Since.Add(s.opt.fetchWait()))
		if h != nil {
			// An index is only written from files with DWARF.
			o.complete = true
			return h, nil
		}
		if err != nil {
			return nil, err
		}
		lease = release
	}
	for attempt := 0; ; attempt++ {
		res, err := s.chain.Locate(ctx, o.q)
		if err != nil {
			return nil, err
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
		if lease != nil {
			if err == nil && o.complete && !o.pending {
				s.idx.build(o.q.ID.GNU, bin, dbg, lease)
			} else {
				lease()
			}
		}
		return h, err
	}
}
