package locate

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/filever"
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
//
// A file it had to open is not closed at once when the chain accepts it:
// it is held (a few, briefly) for the engine, which opens the files the
// chain chose right after (Chain.TakeOpened), so that a cold binary is
// mapped and its headers parsed once rather than twice.
type inspector struct {
	maxBytes int64
	lim      elfx.Limits // what the engine opens files with
	cache    *lru.Cache[string, fileInfo]

	mu   sync.Mutex
	held map[string]heldFile // by filever.Version.String
}

type heldFile struct {
	f  *elfx.File
	at time.Time
}

// Files held for the engine: at most maxHeld, for at most heldFor. The
// engine takes them within microseconds; the bounds only matter for files
// the chain accepted but did not choose.
const (
	maxHeld = 16
	heldFor = 10 * time.Second
)

// inspectTimeout bounds opening one candidate when the caller's context
// has no deadline of its own.
const inspectTimeout = 30 * time.Second

// infoCost approximates a cached fileInfo: key, identity strings, entry.
const infoCost = 400

func newInspector(maxEntries int, maxFileBytes int64, lim elfx.Limits) *inspector {
	lim.MaxFileBytes = maxFileBytes
	return &inspector{maxBytes: maxFileBytes, lim: lim, held: map[string]heldFile{},
		cache: lru.New[string, fileInfo](0, maxEntries, func(fileInfo) int64 { return infoCost }, nil)}
}

// opened is a file the inspector had to open: the caller holds it for the
// engine (hold) or closes it.
type opened struct {
	key string
	f   *elfx.File
}

func (o opened) close() {
	if o.f != nil {
		o.f.Close()
	}
}

// hold keeps o for the engine, closing what it displaces.
func (in *inspector) hold(o opened) {
	if o.f == nil {
		return
	}
	now := time.Now()
	var drop []*elfx.File
	in.mu.Lock()
	oldest := ""
	for k, h := range in.held {
		if now.Sub(h.at) > heldFor {
			drop = append(drop, h.f)
			delete(in.held, k)
		} else if oldest == "" || h.at.Before(in.held[oldest].at) {
			oldest = k
		}
	}
	if prev, ok := in.held[o.key]; ok {
		drop = append(drop, prev.f)
	} else if len(in.held) >= maxHeld {
		drop = append(drop, in.held[oldest].f)
		delete(in.held, oldest)
	}
	in.held[o.key] = heldFile{f: o.f, at: now}
	in.mu.Unlock()
	for _, f := range drop {
		f.Close()
	}
}

// take returns the held file that path is now, if any; the caller owns it.
func (in *inspector) take(path string) *elfx.File {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return nil
	}
	key := filever.Of(path, st).String()
	in.mu.Lock()
	defer in.mu.Unlock()
	h, ok := in.held[key]
	if !ok {
		return nil
	}
	delete(in.held, key)
	return h.f
}

// close drops every held file.
func (in *inspector) close() {
	in.mu.Lock()
	held := in.held
	in.held = map[string]heldFile{}
	in.mu.Unlock()
	for _, h := range held {
		h.f.Close()
	}
}

// inspect returns what path is, and the file when it had to open it.
func (in *inspector) inspect(ctx context.Context, path string) (fileInfo, opened, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fileInfo{}, opened{}, fmt.Errorf("%s: %w", path, frame.ErrNotFound)
		}
		return fileInfo{}, opened{}, fmt.Errorf("%s: %v: %w", path, err, frame.ErrNotFound)
	}
	// Only regular files: a FIFO or a device named by a frame would block
	// or stream forever.
	if !st.Mode().IsRegular() {
		return fileInfo{}, opened{}, fmt.Errorf("%s: not a regular file: %w", path, frame.ErrInvalidPath)
	}
	if st.Size() > in.maxBytes {
		return fileInfo{}, opened{}, fmt.Errorf("%s: %d bytes, more than %d: %w", path, st.Size(), in.maxBytes, frame.ErrLimitExceeded)
	}
	key := filever.Of(path, st).String()
	if fi, ok := in.cache.Get(key); ok {
		return fi, opened{}, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, inspectTimeout)
		defer cancel()
	}
	// Only headers and notes are read here; the engine's limits are for
	// the engine, should it take the file.
	f, err := elfx.OpenContext(ctx, path, in.lim)
	if err != nil {
		if frame.Reason(err) == "error" {
			err = fmt.Errorf("%w: %v", frame.ErrCorruptFile, err)
		}
		return fileInfo{}, opened{}, err
	}
	fi := fileInfo{id: buildid.Identify(f), score: ScoreOf(f), code: hasCode(f)}
	in.cache.Add(key, fi)
	return fi, opened{key: key, f: f}, nil
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
