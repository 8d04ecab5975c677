package otlpsym

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symbolize"
)

// Source names, in the order they are tried by default.
const (
	SourceLocal      = "local"
	SourceDebugDirs  = "debug_directories"
	SourceSymbolDirs = "symbol_directories"
	SourceDebuginfod = "debuginfod"
	// SourceSymbolStore is a symbol store (symbolstore extension) in the
	// same collector, holding what agents and CI uploaded.
	SourceSymbolStore = "symbol_store"
	SourceKernel      = "kernel"
)

// DefaultSources is the order sources are tried in when none is configured.
var DefaultSources = []string{SourceLocal, SourceDebugDirs, SourceSymbolDirs, SourceSymbolStore, SourceDebuginfod, SourceKernel}

// ids is the identity of one mapping's file.
type ids struct {
	gnu, goid, htl string
}

func (i ids) key() string {
	switch {
	case i.gnu != "":
		return "g:" + i.gnu
	case i.goid != "":
		return "o:" + i.goid
	case i.htl != "":
		return "h:" + i.htl
	}
	return ""
}

// fileID is what a file on this machine says about itself.
type fileID struct {
	gnu, goid, htl string
}

// identify reads a local file's identities; results are cached per path,
// size and mtime since the same libraries recur in every batch.
type identifier struct {
	mu sync.Mutex
	m  map[string]identEntry
}

type identEntry struct {
	size  int64
	mtime time.Time
	id    fileID
	err   error
}

func (c *identifier) identify(path string) (fileID, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	c.mu.Lock()
	if e, ok := c.m[path]; ok && e.size == st.Size() && e.mtime.Equal(st.ModTime()) {
		c.mu.Unlock()
		return e.id, e.err
	}
	c.mu.Unlock()
	var id fileID
	f, err := elfx.Open(path)
	if err == nil {
		if b, gerr := buildid.GNU(f); gerr == nil {
			id.gnu = buildid.HexString(b)
		}
		id.goid, _ = buildid.Go(f)
		id.htl, _ = buildid.HTLHashOf(f)
		f.Close()
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]identEntry{}
	}
	if len(c.m) > 1<<16 {
		clear(c.m) // a crude bound; identities are cheap to recompute
	}
	c.m[path] = identEntry{size: st.Size(), mtime: st.ModTime(), id: id, err: err}
	c.mu.Unlock()
	return id, err
}

// matches reports whether a local file is the mapping's file. A GNU build id
// decides when both sides have one; otherwise the Go build id, otherwise the
// OpenTelemetry file hash.
func (id fileID) matches(want ids) bool {
	switch {
	case want.gnu != "" && id.gnu != "":
		return want.gnu == id.gnu
	case want.goid != "" && id.goid != "":
		return want.goid == id.goid
	case want.htl != "" && id.htl != "":
		return want.htl == id.htl
	}
	return false
}

// dirIndex maps identities to files under the configured symbol
// directories: build servers drop binaries and debug files there under any
// name. It rescans when a lookup misses and the last scan is older than
// rescan, so new files are found without a restart.
type dirIndex struct {
	dirs   []string
	rescan time.Duration

	mu       sync.Mutex
	byID     map[string]indexed // ids.key() of the file -> paths
	scanned  time.Time
	scanning bool
}

type indexed struct {
	bin, debug string
}

const maxIndexedFiles = 1 << 20

func newDirIndex(dirs []string, rescan time.Duration) *dirIndex {
	d := &dirIndex{dirs: dirs, rescan: rescan, byID: map[string]indexed{}}
	if len(dirs) > 0 {
		d.scan()
	}
	return d
}

func (d *dirIndex) scan() {
	byID := map[string]indexed{}
	n := 0
	for _, root := range d.dirs {
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !e.Type().IsRegular() {
				return nil
			}
			if n++; n > maxIndexedFiles {
				return fs.SkipAll
			}
			f, err := elfx.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			isDebug := !f.HasSection(".text") || f.Section(".text").Type == 8 /* SHT_NOBITS */
			add := func(k string) {
				x := byID[k]
				if isDebug {
					if x.debug == "" {
						x.debug = p
					}
				} else if x.bin == "" {
					x.bin = p
				}
				byID[k] = x
			}
			if b, err := buildid.GNU(f); err == nil {
				add("g:" + buildid.HexString(b))
			}
			if g, err := buildid.Go(f); err == nil && g != "" {
				add("o:" + g)
			}
			if h, err := buildid.HTLHashOf(f); err == nil && !isDebug {
				add("h:" + h)
			}
			return nil
		})
	}
	d.mu.Lock()
	d.byID = byID
	d.scanned = time.Now()
	d.mu.Unlock()
}

func (d *dirIndex) lookup(key string) (indexed, bool) {
	if len(d.dirs) == 0 || key == "" {
		return indexed{}, false
	}
	d.mu.Lock()
	x, ok := d.byID[key]
	stale := !ok && time.Since(d.scanned) > d.rescan && !d.scanning
	if stale {
		d.scanning = true
	}
	d.mu.Unlock()
	if stale {
		d.scan()
		d.mu.Lock()
		d.scanning = false
		x, ok = d.byID[key]
		d.mu.Unlock()
	}
	return x, ok
}

// locate finds the files of an object known only by identity, trying the
// configured sources (other than local) in order.
func (s *Symbolizer) locate(ctx context.Context, id ids) (string, string, error) {
	var lastErr error = fmt.Errorf("%s: %w", id.key(), frame.ErrNotFound)
	for _, src := range s.opt.Sources {
		switch src {
		case SourceDebugDirs:
			if id.gnu == "" {
				continue
			}
			if b, d := symbolize.LocateInDirs(id.gnu, s.opt.DebugDirs); b != "" || d != "" {
				return b, d, nil
			}
		case SourceSymbolDirs:
			if x, ok := s.symdirs.lookup(id.key()); ok {
				return x.bin, x.debug, nil
			}
		case SourceSymbolStore:
			if s.opt.Store == nil || id.gnu == "" {
				continue
			}
			b, d, err := s.opt.Store.Locate(ctx, id.gnu)
			if err == nil && (b != "" || d != "") {
				return b, d, nil
			}
			if err != nil && !errors.Is(err, frame.ErrNotFound) {
				lastErr = err
			}
		case SourceDebuginfod:
			if s.opt.Debuginfod == nil || id.gnu == "" {
				continue
			}
			b, d, err := s.opt.Debuginfod.Locate(ctx, id.gnu)
			if err == nil && (b != "" || d != "") {
				return b, d, nil
			}
			if err != nil && !errors.Is(err, frame.ErrNotFound) {
				lastErr = err
			}
		}
	}
	return "", "", lastErr
}
