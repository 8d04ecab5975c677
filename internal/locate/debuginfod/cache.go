package debuginfod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// tmpPrefix names downloads in progress; they live in the cache folder so
// the final rename stays on one file system and is atomic.
const tmpPrefix = ".tmp-"

// staleTmp is the age after which a leftover download (from a process that
// died) is removed at startup. Another live process sharing the folder could
// still be writing a younger one.
const staleTmp = time.Hour

type cacheEntry struct {
	path  string
	size  int64
	atime time.Time
}

// scan indexes the files already in the folder, removes stale downloads and
// evicts down to the bound (which may have shrunk since the last run).
func (c *Client) scan() error {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("debuginfod: reading cache folder: %w", err)
	}
	now := time.Now()
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > staleTmp {
				os.Remove(filepath.Join(c.dir, name))
			}
			continue
		}
		id, err := normalizeID(name)
		if err != nil || id != name || !e.IsDir() {
			continue
		}
		for _, kind := range []Kind{DebugInfo, Executable} {
			p := c.path(id, kind)
			info, err := os.Lstat(p)
			if err != nil || !info.Mode().IsRegular() {
				continue
			}
			c.files[key(id, kind)] = &cacheEntry{path: p, size: info.Size(), atime: accessTime(info)}
			c.bytes += info.Size()
		}
	}
	c.mu.Lock()
	c.evict("")
	c.mu.Unlock()
	return nil
}

// hit serves a cached file, bumping its access time on disk too so that the
// LRU order survives restarts (relatime/noatime mounts would not).
func (c *Client) hit(k, id string, kind Kind) (string, bool) {
	p := c.path(id, kind)
	now := time.Now()
	if err := os.Chtimes(p, now, time.Time{}); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			c.drop(k)
			return "", false
		}
		// A read-only cache still serves; only the bump is lost.
		if _, serr := os.Stat(p); serr != nil {
			c.drop(k)
			return "", false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.files[k]
	if !ok {
		return "", false
	}
	e.atime = now
	c.st.Hits++
	return p, true
}

// drop forgets an entry whose file vanished behind our back.
func (c *Client) drop(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.files[k]; ok {
		c.bytes -= e.size
		delete(c.files, k)
	}
}

// adopt indexes a file another process stored and counts it as a hit.
func (c *Client) adopt(k, p string, size int64) {
	now := time.Now()
	os.Chtimes(p, now, time.Time{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.files[k]; ok {
		c.bytes -= old.size
	}
	c.files[k] = &cacheEntry{path: p, size: size, atime: now}
	c.bytes += size
	c.st.Hits++
	c.evict(k)
}

// reserve accounts n more bytes of a download in progress, evicting cached
// files to make room. When the downloads in progress alone fill the budget,
// it fails with frame.ErrLimitExceeded.
func (c *Client) reserve(k string, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes+c.reserved+n > c.cfg.MaxCacheBytes {
		c.evictTo(c.cfg.MaxCacheBytes-c.reserved-n, "")
	}
	if c.bytes+c.reserved+n > c.cfg.MaxCacheBytes {
		err := fmt.Errorf("cache budget of %d bytes is full (%d cached, %d being downloaded): %w",
			c.cfg.MaxCacheBytes, c.bytes, c.reserved, frame.ErrLimitExceeded)
		// The largest download in progress is to blame: a smaller one
		// (a healthy file while an endless body fills the budget) is
		// refused for now only, and not remembered.
		for other, r := range c.resv {
			if other != k && r > c.resv[k]+n {
				return fmt.Errorf("%w (%w)", err, frame.ErrRetry)
			}
		}
		return err
	}
	c.reserved += n
	c.resv[k] += n
	return nil
}

func (c *Client) unreserve(k string, n int64) {
	c.mu.Lock()
	c.reserved -= n
	delete(c.resv, k)
	c.mu.Unlock()
}

// commit renames a verified download into place, indexes it and evicts.
// The rename happens under c.mu so that eviction, which also runs under it,
// never races with a file appearing. The download's reservation becomes the
// file's size.
func (c *Client) commit(k, tmp, final string, size, reserved int64) error {
	// CreateTemp makes 0600 files; other local tools may want to read them.
	os.Chmod(tmp, 0o644)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under c.mu too: eviction removes id folders once they are empty.
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	c.reserved -= reserved
	delete(c.resv, k)
	if old, ok := c.files[k]; ok {
		c.bytes -= old.size
	}
	c.files[k] = &cacheEntry{path: final, size: size, atime: time.Now()}
	c.bytes += size
	c.evict(k)
	return nil
}

// evict removes least recently accessed files until the cache fits,
// sparing keep (the file about to be returned). c.mu is held.
func (c *Client) evict(keep string) { c.evictTo(c.cfg.MaxCacheBytes-c.reserved, keep) }

// evictTo removes least recently accessed files until the cached files take
// at most target bytes, sparing keep. c.mu is held.
func (c *Client) evictTo(target int64, keep string) {
	if c.bytes <= target {
		return
	}
	type cand struct {
		k string
		e *cacheEntry
	}
	var all []cand
	for k, e := range c.files {
		if k != keep {
			all = append(all, cand{k, e})
		}
	}
	slices.SortFunc(all, func(a, b cand) int { return a.e.atime.Compare(b.e.atime) })
	for _, v := range all {
		if c.bytes <= target {
			break
		}
		if err := os.Remove(v.e.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.log.Sugar().Warnf("debuginfod: evicting %s: %v", v.e.path, err)
			continue
		}
		// Removes the id folder only once both kinds are gone.
		os.Remove(filepath.Dir(v.e.path))
		c.bytes -= v.e.size
		delete(c.files, v.k)
		c.st.Evictions++
	}
}
