package symbolize

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/profsym/profsym/internal/dwarf"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
)

// SupRequest asks for the supplementary file (the `dwz -m` common file)
// that a file's DWARF points into.
type SupRequest struct {
	BuildID string // its GNU build id, hex (validated)
	Name    string // the name the referring file records: untrusted
	From    string // the referring file's path
	// ByName is set for a DWARF 5 .debug_sup link, whose checksum need not
	// be a build id: the file is looked for by name (the engine checks
	// the checksum).
	ByName bool
}

// supFile is an open supplementary file, shared by every object whose
// DWARF points into it (a distribution's common file serves a whole
// package's libraries).
type supFile struct {
	key  string
	f    *elfx.File
	t    *dwarf.Table
	refs int // guarded by supCache.mu
}

func (s *supFile) sizeBytes() int64 { return s.f.SizeBytes() + s.t.SizeBytes() }

// supCache shares supplementary files between objects, counted by
// reference: the last object that uses one closes it.
type supCache struct {
	find  func(context.Context, SupRequest) (string, error)
	group singleflight.Group

	mu    sync.Mutex
	files map[string]*supFile
}

func newSupCache(find func(context.Context, SupRequest) (string, error)) *supCache {
	return &supCache{find: find, files: map[string]*supFile{}}
}

// forFile returns the supplementary table f's DWARF links to, with a
// reference the caller releases; nil and no error when f links to none,
// nil and the reason when it cannot be had (its DWARF then answers
// without it).
func (c *supCache) forFile(ctx context.Context, f *elfx.File, lim elfx.Limits,
	open func(context.Context, string, elfx.Limits) (*elfx.File, error)) (*dwarf.Table, *supFile, error) {
	link, ok, err := dwarf.ReadSupLink(f)
	if !ok {
		if err != nil {
			return nil, nil, fmt.Errorf("%s: its link to a dwz file: %w", f.Path, err)
		}
		return nil, nil, nil
	}
	if c == nil || c.find == nil {
		return nil, nil, fmt.Errorf("%s: no source for its dwz file %.200q: %w", f.Path, link.Name, frame.ErrNotFound)
	}
	id := hex.EncodeToString(link.BuildID)
	path, err := c.find(ctx, SupRequest{BuildID: id, Name: link.Name, From: f.Path, ByName: link.DWARF5})
	if err != nil {
		return nil, nil, fmt.Errorf("dwz file %s of %s: %w", id, f.Path, err)
	}
	key, err := filesKey(path, "")
	if err != nil {
		return nil, nil, err
	}
	for {
		c.mu.Lock()
		if s, ok := c.files[key]; ok {
			s.refs++
			c.mu.Unlock()
			return s.t, s, nil
		}
		c.mu.Unlock()
		v, err, _ := c.group.Do(key, func() (any, error) {
			sf, err := open(ctx, path, lim)
			if err != nil {
				return nil, classify(err)
			}
			if !isSup(sf, link) {
				sf.Close()
				return nil, fmt.Errorf("%s is not dwz file %s: %w", path, id, frame.ErrBuildIDMismatch)
			}
			t, err := dwarf.NewSup(sf)
			if err != nil {
				sf.Close()
				return nil, err
			}
			s := &supFile{key: key, f: sf, t: t}
			c.mu.Lock()
			c.files[key] = s
			c.mu.Unlock()
			return s, nil
		})
		if err != nil {
			return nil, nil, err
		}
		_ = v // registered: loop to take a reference
	}
}

// release drops a reference taken by forFile.
func (c *supCache) release(s *supFile) {
	if s == nil {
		return
	}
	c.mu.Lock()
	s.refs--
	last := s.refs <= 0
	if last && c.files[s.key] == s {
		delete(c.files, s.key)
	}
	c.mu.Unlock()
	if last {
		s.f.Close()
	}
}

// isSup reports whether f is the supplementary file link names: by its
// GNU build id, or for a DWARF 5 link by the checksum of its .debug_sup.
func isSup(f *elfx.File, link dwarf.SupLink) bool {
	if got, _ := buildid.GNU(f); bytes.Equal(got, link.BuildID) {
		return true
	}
	sum, ok := dwarf.SupChecksum(f)
	return ok && link.DWARF5 && bytes.Equal(sum, link.BuildID)
}
