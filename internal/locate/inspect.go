package locate

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/lru"
)

// fileInfo is what the chain needs to know about one file.
type fileInfo struct {
	id    frame.Identity
	score Score
	code  bool
}

// inspector reads files' identities and scores once per file version: the
// same libraries come back in every batch and from several sources.
type inspector struct {
	maxBytes int64
	cache    *lru.Cache[string, fileInfo]
}

// inspectTimeout bounds opening one candidate when the caller's context
// has no deadline of its own.
const inspectTimeout = 30 * time.Second

// infoCost approximates a cached fileInfo: key, identity strings, entry.
const infoCost = 400

func newInspector(maxEntries int, maxFileBytes int64) *inspector {
	return &inspector{maxBytes: maxFileBytes,
		cache: lru.New[string, fileInfo](0, maxEntries, func(fileInfo) int64 { return infoCost }, nil)}
}

func (in *inspector) inspect(ctx context.Context, path string) (fileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fileInfo{}, fmt.Errorf("%s: %w", path, frame.ErrNotFound)
		}
		return fileInfo{}, fmt.Errorf("%s: %v: %w", path, err, frame.ErrNotFound)
	}
	// Only regular files: a FIFO or a device named by a frame would block
	// or stream forever.
	if !st.Mode().IsRegular() {
		return fileInfo{}, fmt.Errorf("%s: not a regular file: %w", path, frame.ErrInvalidPath)
	}
	if st.Size() > in.maxBytes {
		return fileInfo{}, fmt.Errorf("%s: %d bytes, more than %d: %w", path, st.Size(), in.maxBytes, frame.ErrLimitExceeded)
	}
	key := statKey(path, st)
	if fi, ok := in.cache.Get(key); ok {
		return fi, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, inspectTimeout)
		defer cancel()
	}
	// Only headers and notes are read: no decompression budget is needed.
	f, err := elfx.OpenContext(ctx, path, elfx.Limits{MaxFileBytes: in.maxBytes, MaxDecompressedBytes: 1 << 20})
	if err != nil {
		if frame.Reason(err) == "error" {
			err = fmt.Errorf("%w: %v", frame.ErrCorruptFile, err)
		}
		return fileInfo{}, err
	}
	defer f.Close()
	fi := fileInfo{id: buildid.Identify(f), score: ScoreOf(f), code: hasCode(f)}
	in.cache.Add(key, fi)
	return fi, nil
}

// ScoreOf ranks the symbol data a file holds.
func ScoreOf(f *elfx.File) Score {
	switch {
	case f.HasSection(".debug_info"):
		return ScoreDWARF
	case f.HasSection(".gopclntab"):
		return ScorePclntab
	case f.HasSection(".symtab"), f.HasSection(".gnu_debugdata"): // MiniDebugInfo holds a .symtab
		return ScoreSymtab
	case f.HasSection(".dynsym"):
		return ScoreDynsym
	}
	return ScoreNone
}

// hasCode reports whether the file holds code bytes, as a binary does and a
// separate debug file (whose .text is SHT_NOBITS) does not.
func hasCode(f *elfx.File) bool {
	if s := f.Section(".text"); s != nil {
		return s.Type != elf.SHT_NOBITS && s.Size > 0
	}
	for _, p := range f.Loads() {
		if p.Flags&elf.PF_X != 0 && p.Filesz > 0 {
			return true
		}
	}
	return false
}
