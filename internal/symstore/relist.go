package symstore

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"go.uber.org/zap"
)

// relist rebuilds the index from the backend.
func (s *Store) relist(ctx context.Context) error {
	idx := map[Key]uint8{}
	var n, b int64
	err := s.be.List(ctx, func(key Key, k Kind, size int64) {
		idx[key] |= kindBit(k)
		n++
		b += size
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	grew := n != s.objects
	s.index, s.objects, s.bytes, s.listed = idx, n, b, time.Now()
	s.mu.Unlock()
	if grew {
		s.gen.Add(1)
	}
	return nil
}

// Watcher is a backend that another process fills and that says cheaply
// whether it changed (a store read over HTTP): the store polls it instead
// of listing it.
type Watcher interface {
	Changed(ctx context.Context) (bool, error)
}

// Refresh starts relisting a shared backend, in the background, when the
// last listing is older than Rescan: a large bucket must not hold up a
// query or a symbolizer batch. A watched backend is polled instead, and its
// changes move the generation. The directory backend is only written by
// this process.
func (s *Store) Refresh(context.Context) {
	if _, local := s.be.(*Dir); local {
		return
	}
	s.mu.Lock()
	stale := time.Since(s.listed) > s.cfg.Rescan
	if stale {
		s.listed = time.Now() // one relist at a time
	}
	s.mu.Unlock()
	if !stale {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Rescan)
		defer cancel()
		if w, ok := s.be.(Watcher); ok {
			changed, err := w.Changed(ctx)
			if err != nil {
				s.log.Warn("symbol store: polling the remote store failed", zap.Stringer("backend", s.be), zap.Error(err))
			}
			if changed {
				s.gen.Add(1)
			}
			return
		}
		if err := s.relist(ctx); err != nil {
			s.log.Warn("symbol store: relisting failed", zap.Stringer("backend", s.be), zap.Error(err))
		}
	}()
}

// statBackend catches files another gateway stored in a shared backend
// since the last listing.
func (s *Store) statBackend(ctx context.Context, key Key, kind Kind) bool {
	ok, _ := s.probe(ctx, key, kind)
	return ok
}

// probe is statBackend that tells a file absent from a backend that could
// not answer.
func (s *Store) probe(ctx context.Context, key Key, kind Kind) (bool, error) {
	if _, local := s.be.(*Dir); local {
		return false, nil
	}
	size, err := s.be.Stat(ctx, key, kind)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	if s.index[key]&kindBit(kind) == 0 {
		s.index[key] |= kindBit(kind)
		s.objects++
		s.bytes += size
		s.gen.Add(1)
	}
	s.mu.Unlock()
	return true, nil
}
