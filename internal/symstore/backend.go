package symstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/profsym/profsym/internal/frame"
)

// Kind is what a stored file is for a build id, named as in the debuginfod
// protocol.
type Kind string

const (
	DebugInfo  Kind = "debuginfo"  // the sections needed to symbolize
	Executable Kind = "executable" // the loadable object itself
	// SymIndex is a gateway's compiled symbol index of a build, kept so
	// other gateways need not parse its DWARF again. It is no debuginfod
	// kind (ParseKind refuses it), so those routes never reach it: the
	// store's LocateIndex and PutIndex do, and gateways over HTTP use
	// profsym's own PathIndex.
	SymIndex Kind = "symindex"
)

// storedKinds lists every kind a backend keeps, for listing it.
var storedKinds = []Kind{DebugInfo, Executable, SymIndex}

// ParseKind accepts only the two protocol names.
func ParseKind(s string) (Kind, bool) {
	switch Kind(s) {
	case DebugInfo, Executable:
		return Kind(s), true
	}
	return "", false
}

// validKind is what a backend accepts: the protocol kinds and the
// internal ones.
func validKind(s string) (Kind, bool) {
	if k, ok := ParseKind(s); ok {
		return k, true
	}
	if Kind(s) == SymIndex {
		return SymIndex, true
	}
	return "", false
}

// Object is a stored file opened for reading.
type Object interface {
	io.ReadSeekCloser
	Size() int64
	ModTime() time.Time
}

// Backend keeps files by (key, kind). Keys reaching a backend were made by
// ParseKey, GNUKey or GoKey, and kinds by ParseKind or are SymIndex;
// backends check them again (validKind) before building a path or an
// object name.
type Backend interface {
	// List calls fn for every stored file.
	List(ctx context.Context, fn func(key Key, kind Kind, size int64)) error
	// Stat returns the size of a stored file, or an error wrapping
	// fs.ErrNotExist.
	Stat(ctx context.Context, key Key, kind Kind) (int64, error)
	// Put stores the verified file at path, atomically: readers see the
	// whole file or nothing. The backend may move or remove path.
	Put(ctx context.Context, key Key, kind Kind, path string, size int64) error
	// Open returns a stored file; errors wrap fs.ErrNotExist when absent.
	Open(ctx context.Context, key Key, kind Kind) (Object, error)
	// LocalPath returns a path on this host holding the file, when the
	// backend keeps files on a local disk.
	LocalPath(key Key, kind Kind) (string, bool)
	String() string
}

// Dir stores files under Root as NAMESPACE/ID/KIND (buildid/ab12.../debuginfo,
// gobuildid/4e6b.../debuginfo). Uploads are written under Root/.tmp first,
// so a rename makes them visible.
type Dir struct {
	Root string
}

// NewDir creates the directory layout.
func NewDir(root string) (*Dir, error) {
	if root == "" {
		return nil, errors.New("directory backend: empty path")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{string(NSBuildID), string(NSGoBuildID), ".tmp"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o750); err != nil {
			return nil, fmt.Errorf("directory backend: %w", err)
		}
	}
	return &Dir{Root: abs}, nil
}

func (d *Dir) String() string { return "directory " + d.Root }

// TempDir is where uploads are spooled; it is on the same file system as
// the store so Put is a rename.
func (d *Dir) TempDir() string { return filepath.Join(d.Root, ".tmp") }

// path joins a validated key and kind under the root, and checks the
// result stays inside the key's namespace even so.
func (d *Dir) path(key Key, kind Kind) (string, error) {
	if err := key.valid(); err != nil {
		return "", err
	}
	if _, ok := validKind(string(kind)); !ok {
		return "", fmt.Errorf("kind %q: %w", kind, frame.ErrInvalidPath)
	}
	base := filepath.Join(d.Root, string(key.NS))
	p := filepath.Join(base, key.ID, string(kind))
	if rel, err := filepath.Rel(base, p); err != nil || rel == ".." || strings.HasPrefix(rel, "../") || !strings.Contains(rel, "/") {
		return "", fmt.Errorf("%q escapes the store: %w", p, frame.ErrInvalidPath)
	}
	return p, nil
}

func (d *Dir) List(ctx context.Context, fn func(Key, Kind, int64)) error {
	for _, ns := range namespaces {
		base := filepath.Join(d.Root, string(ns))
		ents, err := os.ReadDir(base)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a store made before this namespace existed
		}
		if err != nil {
			return err
		}
		for _, e := range ents {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			key, err := parseNS(ns, e.Name())
			if err != nil || key.ID != e.Name() || !e.IsDir() {
				continue
			}
			for _, k := range storedKinds {
				if st, err := os.Lstat(filepath.Join(base, key.ID, string(k))); err == nil && st.Mode().IsRegular() {
					fn(key, k, st.Size())
				}
			}
		}
	}
	return nil
}

func (d *Dir) Stat(_ context.Context, key Key, kind Kind) (int64, error) {
	p, err := d.path(key, kind)
	if err != nil {
		return 0, err
	}
	st, err := os.Lstat(p)
	if err != nil {
		return 0, err
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s: not a regular file: %w", p, fs.ErrNotExist)
	}
	return st.Size(), nil
}

func (d *Dir) Put(_ context.Context, key Key, kind Kind, path string, _ int64) error {
	p, err := d.path(key, kind)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	if err := os.Chmod(path, 0o640); err != nil {
		return err
	}
	err = os.Rename(path, p) //nolint:gosec // p is d.path's, checked to stay under the root
	if errors.Is(err, syscall.EXDEV) {
		// path is on another file system (a scratch directory elsewhere):
		// copy it under the root, then rename, so readers still see the
		// whole file or nothing.
		err = d.copyIn(path, p)
	}
	return err
}

// copyIn copies src into the store's temp dir, renames the copy to dst and
// removes src.
func (d *Dir) copyIn(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	tmp, err := os.CreateTemp(d.TempDir(), "copy-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() //nolint:gosec // a no-op once renamed; under the store's temp dir
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o640) //nolint:gosec // as Put: readable by the store's group
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst) //nolint:gosec // dst is d.path's, checked to stay under the root
	}
	if err != nil {
		return err
	}
	_ = os.Remove(src)
	return nil
}

func (d *Dir) Open(_ context.Context, key Key, kind Kind) (Object, error) {
	p, err := d.path(key, kind)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file: %w", p, fs.ErrNotExist)
	}
	return &fileObject{File: f, size: st.Size(), mod: st.ModTime()}, nil
}

func (d *Dir) LocalPath(key Key, kind Kind) (string, bool) {
	p, err := d.path(key, kind)
	return p, err == nil
}

// fileObject is an *os.File: http.ServeContent's copy to the connection
// then uses sendfile.
type fileObject struct {
	*os.File
	size int64
	mod  time.Time
}

func (f *fileObject) Size() int64        { return f.size }
func (f *fileObject) ModTime() time.Time { return f.mod }
