package locate

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/filever"
)

// Defaults of the symbol-directory index.
const (
	DefaultRescan          = 30 * time.Second
	DefaultMaxIndexedFiles = 1 << 20
)

// SymbolDirs indexes folders where build servers drop binaries and debug
// files under any name, by every identity each file carries. A lookup on an
// index older than Rescan rescans first, so files added later are found
// without a restart; unchanged files are not reopened.
type SymbolDirs struct {
	dirs     []string
	rescan   time.Duration
	maxFiles int

	mu       sync.Mutex
	byID     map[string][]string // identity key -> files
	known    map[string]indexedFile
	scanned  time.Time
	scanning bool
	files    int
}

type indexedFile struct {
	stat filever.Version // at indexing time
	keys []string
}

// NewSymbolDirs indexes dirs now. rescan <= 0 is DefaultRescan; maxFiles <=
// 0 is DefaultMaxIndexedFiles (files beyond it are not indexed).
func NewSymbolDirs(dirs []string, rescan time.Duration, maxFiles int) *SymbolDirs {
	if rescan <= 0 {
		rescan = DefaultRescan
	}
	if maxFiles <= 0 {
		maxFiles = DefaultMaxIndexedFiles
	}
	d := &SymbolDirs{dirs: dirs, rescan: rescan, maxFiles: maxFiles, byID: map[string][]string{}, known: map[string]indexedFile{}}
	if len(dirs) > 0 {
		d.scan()
	}
	return d
}

func (*SymbolDirs) Name() string { return SourceSymbolDirs }

// Files is the number of files indexed.
func (d *SymbolDirs) Files() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.files
}

func (d *SymbolDirs) scan() {
	d.mu.Lock()
	old := d.known
	d.mu.Unlock()
	byID := map[string][]string{}
	known := make(map[string]indexedFile, len(old))
	n := 0
	for _, root := range d.dirs {
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !e.Type().IsRegular() {
				return nil
			}
			if n++; n > d.maxFiles {
				return fs.SkipAll
			}
			st, err := os.Stat(p)
			if err != nil {
				return nil
			}
			sk := filever.Of(p, st)
			x, ok := old[p]
			if !ok || x.stat != sk {
				x = indexedFile{stat: sk, keys: identityKeys(p)}
			}
			known[p] = x
			for _, k := range x.keys {
				byID[k] = append(byID[k], p)
			}
			return nil
		})
	}
	d.mu.Lock()
	d.byID, d.known, d.files = byID, known, min(n, d.maxFiles)
	d.scanned = time.Now()
	d.mu.Unlock()
}

// byName returns the files called name (split DWARF: .dwo and .dwp
// files, which carry no build id).
func (d *SymbolDirs) byName(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.byID["n:"+name]...)
}

// identityKeys lists the keys a file is found by: each of its ids, since a
// mapping may carry any of them; a .dwo or .dwp file by its name.
func identityKeys(p string) []string {
	if b := filepath.Base(p); strings.HasSuffix(b, ".dwo") || strings.HasSuffix(b, ".dwp") {
		return []string{"n:" + b}
	}
	f, err := elfx.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	id := buildid.Identify(f)
	var keys []string
	if id.GNU != "" {
		keys = append(keys, "g:"+id.GNU)
	}
	if id.Go != "" {
		keys = append(keys, "o:"+id.Go)
	}
	if id.HTL != "" && hasCode(f) {
		keys = append(keys, "h:"+id.HTL)
	}
	return keys
}

func (d *SymbolDirs) Find(_ context.Context, q *Query) ([]Candidate, error) {
	if len(d.dirs) == 0 {
		return nil, nil
	}
	d.mu.Lock()
	stale := time.Since(d.scanned) > d.rescan && !d.scanning
	if stale {
		d.scanning = true
	}
	d.mu.Unlock()
	if stale {
		d.scan()
		d.mu.Lock()
		d.scanning = false
		d.mu.Unlock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Candidate
	seen := map[string]bool{}
	for _, k := range []string{prefixed("g:", q.ID.GNU), prefixed("o:", q.ID.Go), prefixed("h:", q.ID.HTL)} {
		if k == "" {
			continue
		}
		for _, p := range d.byID[k] {
			if !seen[p] {
				seen[p] = true
				out = append(out, Candidate{Path: p, Dir: filepath.Dir(p), HostDir: filepath.Dir(p)})
			}
		}
	}
	return out, nil
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}
