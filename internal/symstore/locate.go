package symstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// Open returns a stored file for serving.
func (s *Store) Open(ctx context.Context, rawKey string, kind Kind) (Object, error) {
	key, err := ParseKey(rawKey)
	if err != nil {
		return nil, reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	return s.be.Open(ctx, key, kind)
}

// Locate implements the symbolizer's locator: the stored files of a GNU
// build id as local paths (fetched into the scratch cache for a remote
// backend). Uploaded debuginfo is returned as the debug file; an uploaded
// executable as the binary.
func (s *Store) Locate(ctx context.Context, rawID string) (binPath, debugPath string, err error) {
	key, err := GNUKey(rawID)
	if err != nil {
		return "", "", err
	}
	return s.LocateKey(ctx, key)
}

// LocateKey is Locate for any key: a Go binary without a GNU build id is
// found by its Go build id.
func (s *Store) LocateKey(ctx context.Context, key Key) (binPath, debugPath string, err error) {
	if err := key.valid(); err != nil {
		return "", "", err
	}
	s.Refresh(ctx)
	if !s.has(key, DebugInfo) && !s.has(key, Executable) {
		ok, err := s.probe(ctx, key, DebugInfo)
		if err != nil {
			// Not remembered as absent: the next batch asks again.
			return "", "", fmt.Errorf("symbol store %s: %w: %v", s.be, frame.ErrFetchFailed, err)
		}
		if !ok {
			return "", "", fmt.Errorf("symbol store has no %s: %w", key, frame.ErrNotFound)
		}
	}
	if s.has(key, DebugInfo) {
		if debugPath, err = s.local(ctx, key, DebugInfo); err != nil {
			return "", "", err
		}
	}
	if s.has(key, Executable) {
		if binPath, err = s.local(ctx, key, Executable); err != nil && debugPath == "" {
			return "", "", err
		}
	}
	s.obs.Served(DebugInfo, 0)
	return binPath, debugPath, nil
}

// local returns a path on this host for a stored file. A remote file is
// copied into the scratch cache once, by one goroutine bounded by
// FetchTimeout rather than by the caller: a caller whose batch ends first
// stops waiting, and the next finds the copy done or still running.
func (s *Store) local(ctx context.Context, key Key, kind Kind) (string, error) {
	if p, ok := s.be.LocalPath(key, kind); ok {
		return p, nil
	}
	dst := filepath.Join(s.tmp, "cache", string(key.NS), key.ID, string(kind))
	if st, err := os.Stat(dst); err == nil && st.Mode().IsRegular() {
		return dst, nil
	}
	ch := s.fetches.DoChan(dst, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.Background(), s.cfg.FetchTimeout)
		defer cancel()
		return dst, s.fetch(fctx, key, kind, dst)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return dst, nil
	case <-ctx.Done():
		return "", fmt.Errorf("%s/%s: still copying from %s: %w", key.Path(), kind, s.be, frame.ErrTimeout)
	}
}

func (s *Store) fetch(ctx context.Context, key Key, kind Kind, dst string) error {
	o, err := s.be.Open(ctx, key, kind)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s/%s: %w", key.Path(), kind, frame.ErrNotFound)
		}
		return fmt.Errorf("%s/%s: %w: %v", key.Path(), kind, frame.ErrFetchFailed, err)
	}
	defer o.Close()
	limit := s.cfg.MaxUploadBytes
	if kind == SymIndex {
		limit = s.cfg.MaxIndexBytes
	}
	if o.Size() > s.cfg.CacheBytes || o.Size() > limit {
		return fmt.Errorf("%s/%s of %d bytes: %w", key.Path(), kind, o.Size(), frame.ErrLimitExceeded)
	}
	s.makeRoom(o.Size())
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(o, o.Size()+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil || n != o.Size() {
		return fmt.Errorf("%s/%s: %w: %d of %d bytes: %v", key.Path(), kind, frame.ErrFetchFailed, n, o.Size(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	s.cacheMu.Lock()
	s.cache[dst] = n
	s.cached += n
	s.cacheMu.Unlock()
	return nil
}

// makeRoom evicts the oldest local copies until n more bytes fit. Files
// still open elsewhere stay readable until closed.
func (s *Store) makeRoom(n int64) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	if s.cached+n <= s.cfg.CacheBytes {
		return
	}
	type ent struct {
		p   string
		mod time.Time
	}
	var all []ent
	for p := range s.cache {
		st, err := os.Stat(p)
		if err != nil {
			delete(s.cache, p)
			continue
		}
		all = append(all, ent{p, st.ModTime()})
	}
	slices.SortFunc(all, func(a, b ent) int { return a.mod.Compare(b.mod) })
	for _, e := range all {
		if s.cached+n <= s.cfg.CacheBytes {
			break
		}
		os.Remove(e.p)
		s.cached -= s.cache[e.p]
		delete(s.cache, e.p)
	}
}
