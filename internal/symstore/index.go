package symstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/frame"
)

// A symbol index is a gateway's compiled form of a build's debug info,
// kept under the build's GNU build id as kind SymIndex so that other
// gateways over the same backend read it instead of parsing DWARF again.
// The store treats it as an opaque file of at most MaxIndexBytes. The
// debuginfod routes never reach it (ParseKind refuses the kind); gateways
// over a Remote backend read, lease and store indexes through the owner's
// PathIndex route and index queries instead, so indexes are shared in
// every mode.

// LocateIndex returns a local path holding the index stored for a GNU
// build id (copied into the scratch cache from a remote backend), or an
// error wrapping frame.ErrNotFound.
func (s *Store) LocateIndex(ctx context.Context, buildID string) (string, error) {
	key, err := GNUKey(buildID)
	if err != nil {
		return "", err
	}
	s.Refresh(ctx)
	if !s.has(key, SymIndex) {
		ok, err := s.probe(ctx, key, SymIndex)
		if err != nil {
			// Not remembered as absent: the next batch asks again.
			return "", fmt.Errorf("symbol store %s: %w: %w", s.be, frame.ErrFetchFailed, err)
		}
		if !ok {
			return "", fmt.Errorf("symbol store has no index of %s: %w", key, frame.ErrNotFound)
		}
	}
	p, err := s.local(ctx, key, SymIndex)
	if err != nil {
		return "", err
	}
	// A directory store's file is handed out in place: it must still be a
	// regular file (not removed, nor replaced by a symlink) and in bounds.
	st, err := os.Lstat(p)
	if err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("symbol store index of %s: not a regular file: %w", key, frame.ErrNotFound)
	}
	if st.Size() > s.cfg.MaxIndexBytes {
		return "", fmt.Errorf("symbol store index of %s: %d bytes, over max_index_bytes %d: %w", key, st.Size(), s.cfg.MaxIndexBytes, frame.ErrLimitExceeded)
	}
	// Located in process, as Locate is: a hit, no bytes over the protocol.
	s.obs.Served(SymIndex, 0)
	return p, nil
}

// PutIndex stores the index file at path for a GNU build id. path must be
// a regular file (a symlink is refused) of at most MaxIndexBytes; it is
// moved or removed once stored, or when the store already has an index
// (the stored one is kept). The store's limits apply as to uploads.
//
// Over a Remote backend the file is sent to the owner under the index
// lease this store holds for it (LeaseIndex), or under a new token, which
// the owner accepts while nobody else holds the lease.
func (s *Store) PutIndex(ctx context.Context, buildID, path string) error {
	key, err := GNUKey(buildID)
	if err != nil {
		return err
	}
	if r, ok := s.be.(*Remote); ok {
		return s.putIndexRemote(ctx, r, key, path)
	}
	_, err = s.putIndexLocal(ctx, key, path)
	return err
}

// openIndex opens the index file at path for storing, checked as PutIndex
// says.
func (s *Store) openIndex(key Key, path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("symbol index of %s: %w: %w", key, frame.ErrInvalidPath, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, nil, fmt.Errorf("symbol index of %s: %s is not a regular file: %w", key, path, frame.ErrInvalidPath)
	}
	if n := st.Size(); n > s.cfg.MaxIndexBytes {
		_ = f.Close()
		return nil, nil, fmt.Errorf("symbol index of %s: %d bytes, at most %d (max_index_bytes): %w", key, n, s.cfg.MaxIndexBytes, frame.ErrLimitExceeded)
	}
	return f, st, nil
}

// putIndexLocal is PutIndex into this store's own backend; stored is false
// when an index was there already.
func (s *Store) putIndexLocal(ctx context.Context, key Key, path string) (stored bool, err error) {
	f, st, err := s.openIndex(key, path)
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	n := st.Size()
	if s.has(key, SymIndex) || s.statBackend(ctx, key, SymIndex) {
		s.obs.Deduped(SymIndex)
		_ = os.Remove(path)
		return false, nil
	}
	if err := s.room(n); err != nil {
		return false, err
	}
	staged, err := s.stage(f, st, path)
	if err != nil {
		return false, fmt.Errorf("symbol index of %s: %w", key, err)
	}
	defer func() { _ = os.Remove(staged) }() // a no-op once stored
	if err := s.reserve(n); err != nil {
		return false, err
	}
	err = s.be.Put(ctx, key, SymIndex, staged, n)
	s.mu.Lock()
	s.reserved -= n
	s.reservedObjects--
	if err == nil && s.index[key]&kindBit(SymIndex) == 0 {
		s.objects++
		s.bytes += n
		s.index[key] |= kindBit(SymIndex)
	}
	s.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("storing %s/%s in %s: %w", key.Path(), SymIndex, s.be, err)
	}
	s.gen.Add(1)
	s.obs.Stored(SymIndex, n)
	s.log.Info("symbol store: stored", zap.String("key", key.Path()), zap.String("kind", string(SymIndex)), zap.Int64("bytes", n))
	return true, nil
}

// putIndexRemote sends the index to the owner store. Once it is there the
// file is known here at once (no rescan), and LocateIndex copies it back
// from the owner when asked.
func (s *Store) putIndexRemote(ctx context.Context, r *Remote, key Key, path string) error {
	f, st, err := s.openIndex(key, path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	n := st.Size()
	if s.has(key, SymIndex) {
		s.obs.Deduped(SymIndex)
		_ = os.Remove(path)
		return nil
	}
	s.mu.Lock()
	tok := s.indexLeases[key].token
	s.mu.Unlock()
	fresh := tok == ""
	if fresh {
		tok = newToken()
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout)
	defer cancel()
	stored, err := r.putIndex(pctx, key, f, n, tok)
	if err != nil {
		if fresh {
			// The owner may have taken the lease for this upload and kept
			// it when the body failed: nobody else would renew or drop it.
			s.dropLease(LeaseName{Key: key, For: SymIndex}, tok)
		}
		return fmt.Errorf("storing the index of %s in %s: %w", key, r, err)
	}
	s.mu.Lock()
	if s.index[key]&kindBit(SymIndex) == 0 {
		s.objects++
		s.bytes += n
		s.index[key] |= kindBit(SymIndex)
	}
	s.mu.Unlock()
	_ = os.Remove(path)
	if !stored {
		s.obs.Deduped(SymIndex)
		return nil
	}
	s.gen.Add(1)
	s.obs.Stored(SymIndex, n)
	s.log.Info("symbol store: stored", zap.String("key", key.Path()), zap.String("kind", string(SymIndex)),
		zap.Int64("bytes", n), zap.Stringer("backend", r))
	return nil
}

// stage brings the file at path (open as f, with info st) into the scratch
// directory, where the backend takes it from: a rename when both are on
// one file system and path is still the file opened, else a copy of what
// was opened and checked. path is gone afterwards.
func (s *Store) stage(f *os.File, st os.FileInfo, path string) (string, error) {
	dst := filepath.Join(s.tmp, "index-"+newToken())
	if err := os.Rename(path, dst); err == nil {
		if got, err := os.Lstat(dst); err == nil && os.SameFile(got, st) && got.Size() == st.Size() {
			return dst, nil
		}
		// path was replaced after it was opened: what moved is not what
		// was checked.
		_ = os.Remove(dst)
	}
	tmp, err := os.CreateTemp(s.tmp, "index-*")
	if err != nil {
		return "", err
	}
	n, err := io.Copy(tmp, io.NewSectionReader(f, 0, st.Size()))
	if err == nil && n != st.Size() {
		err = fmt.Errorf("copied %d of %d bytes: %w", n, st.Size(), io.ErrUnexpectedEOF)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return "", err
	}
	_ = os.Remove(path)
	return tmp.Name(), nil
}

// LeaseIndex asks to build the index of a GNU build id. held: the caller
// builds it, calls PutIndex, then release; the lease is extended every
// Lease/3 meanwhile. !held: the store has the index, or another builder
// (in this store, or in another store over the same bucket) holds the
// lease: look for the index later. The lease is apart from the upload
// lease of the same id. release is never nil, idempotent, and returns once
// the renewing goroutine has stopped.
func (s *Store) LeaseIndex(ctx context.Context, buildID string) (held bool, release func(), err error) {
	nop := func() {}
	key, err := GNUKey(buildID)
	if err != nil {
		return false, nop, err
	}
	if r, ok := s.be.(*Remote); ok {
		return s.leaseIndexRemote(ctx, r, key)
	}
	if s.has(key, SymIndex) || s.statBackend(ctx, key, SymIndex) {
		return false, nop, nil
	}
	name := LeaseName{Key: key, For: SymIndex}
	tok := newToken()
	if s.shared != nil {
		ok, err := s.shared.AcquireLease(ctx, name, tok, s.cfg.Lease)
		if err != nil {
			return false, nop, fmt.Errorf("leasing the index of %s in %s: %w", key, s.be, err)
		}
		if !ok {
			return false, nop, nil
		}
		if s.statBackend(ctx, key, SymIndex) {
			// The previous holder stored it and released between our first
			// look and the lease: building it again would be waste.
			s.dropLease(name, tok)
			return false, nop, nil
		}
	} else if !s.holdIndex(key, tok) {
		return false, nop, nil
	}
	return true, s.keepLease(name, tok, s.cfg.Lease/3), nil
}

// leaseIndexRemote is LeaseIndex over a Remote backend: the owner hands
// out the lease (one builder across every gateway reading it), this store
// renews it over HTTP and remembers its token for PutIndex.
func (s *Store) leaseIndexRemote(ctx context.Context, r *Remote, key Key) (bool, func(), error) {
	nop := func() {}
	if s.has(key, SymIndex) {
		return false, nop, nil
	}
	s.mu.Lock()
	_, mine := s.indexLeases[key]
	s.mu.Unlock()
	if mine {
		// A builder in this process holds it: no need to ask the owner.
		return false, nop, nil
	}
	qctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	ans, err := r.indexLease(qctx, key, "")
	if err != nil {
		return false, nop, fmt.Errorf("leasing the index of %s in %s: %w", key, s.be, err)
	}
	if ans.stored {
		// Known now, so LocateIndex fetches it without asking again.
		_, _ = s.probe(ctx, key, SymIndex)
	}
	if ans.token == "" {
		return false, nop, nil
	}
	s.mu.Lock()
	// until is unused here: the owner keeps the lease's time.
	s.indexLeases[key] = lease{token: ans.token}
	s.mu.Unlock()
	every := s.cfg.Lease / 3
	if ans.seconds > 0 {
		every = time.Duration(ans.seconds) * time.Second / 3
	}
	return true, s.keepLease(LeaseName{Key: key, For: SymIndex}, ans.token, every), nil
}

// holdIndex takes the in-memory index lease on key for tok unless another
// token holds it (tok holding it extends it: a renewal over HTTP).
func (s *Store) holdIndex(key Key, tok string) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.indexLeases[key]; ok && now.Before(l.until) && l.token != tok {
		return false
	}
	if len(s.indexLeases) >= s.maxLeases() {
		// Holders that never released: drop the expired ones; if all are
		// live, nobody more builds until some end.
		for k, l := range s.indexLeases {
			if now.After(l.until) {
				delete(s.indexLeases, k)
			}
		}
		if len(s.indexLeases) >= s.maxLeases() {
			return false
		}
	}
	s.indexLeases[key] = lease{token: tok, until: now.Add(s.cfg.Lease)}
	return true
}

// keepLease extends token's lease on name every interval (a third of the
// lease) until the returned release, which stops the goroutine, waits for
// it and drops the lease.
func (s *Store) keepLease(name LeaseName, token string, every time.Duration) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(every, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !s.extendLease(ctx, name, token) {
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			s.dropLease(name, token)
		})
	}
}

// extendLease moves token's lease on name to a full Lease from now. false:
// the lease is lost (expired and taken over), so there is nothing left to
// keep; the holder's PutIndex still works, deduplicated if the other
// builder stored first.
func (s *Store) extendLease(ctx context.Context, name LeaseName, token string) bool {
	if r, ok := s.be.(*Remote); ok && name.For == SymIndex {
		ectx, cancel := context.WithTimeout(ctx, remoteTimeout)
		defer cancel()
		ans, err := r.indexLease(ectx, name.Key, token)
		switch {
		case err != nil && ctx.Err() == nil:
			// Try again at the next tick; the lease lasts two more.
			s.log.Debug("symbol store: extending an index lease failed", zap.Stringer("key", name.Key), zap.Error(err))
			return true
		case err != nil:
			return false
		case ans.token != token:
			s.log.Debug("symbol store: index lease lost while held", zap.Stringer("key", name.Key), zap.Bool("stored", ans.stored))
			return false
		}
		return true
	}
	if s.shared != nil {
		ectx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		ok, err := s.shared.ExtendLease(ectx, name, token, s.cfg.Lease)
		switch {
		case err != nil && !errors.Is(err, context.Canceled):
			// Try again at the next tick; the lease lasts two more.
			s.log.Debug("symbol store: extending a lease failed", zap.Stringer("key", name.Key), zap.Error(err))
			return true
		case err != nil:
			return false
		case !ok:
			s.log.Debug("symbol store: lease lost while held", zap.Stringer("key", name.Key), zap.String("for", string(name.For)))
		}
		return ok
	}
	m := s.leaseMap(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := m[name.Key]
	if !ok || l.token != token {
		return false
	}
	m[name.Key] = lease{token: token, until: time.Now().Add(s.cfg.Lease)}
	return true
}
