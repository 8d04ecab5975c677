package debuginfod

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Locate implements symbolize.Locator. It prefers the debug file. When that
// file is a complete object (code bytes and all, as when a server indexes
// unstripped binaries), it is returned as the binary, which needs nothing
// more. When it lacks what lookups need (no DWARF, so names must come from
// the executable's symbol table or pclntab; or no PT_LOAD headers for
// address math), the executable is fetched too and both are returned. When
// the server has no debug file, the executable alone is returned.
func (c *Client) Locate(ctx context.Context, buildID string) (binPath, debugPath string, err error) {
	dbg, err := c.Fetch(ctx, buildID, DebugInfo)
	if err != nil {
		// Only a clean "no such file" is worth a second request: after a
		// timeout or failure the same server would likely cost Timeout again.
		if !errors.Is(err, frame.ErrNotFound) {
			return "", "", err
		}
		bin, berr := c.Fetch(ctx, buildID, Executable)
		if berr != nil {
			if errors.Is(berr, frame.ErrNotFound) {
				return "", "", err
			}
			return "", "", berr
		}
		return bin, "", nil
	}
	complete, sufficient := inspect(dbg)
	switch {
	case complete:
		return dbg, "", nil
	case sufficient:
		return "", dbg, nil
	}
	bin, berr := c.Fetch(ctx, buildID, Executable)
	if berr != nil {
		// The debug file still names what its symbol table can.
		c.log.Debug("debuginfod: executable unavailable; using the debug file alone",
			zap.String("build_id", buildID), zap.Error(berr))
		return "", dbg, nil
	}
	return bin, dbg, nil
}

// inspect classifies a fetched debuginfo file: complete when its code is
// present (loadable .text with bytes in the file), sufficient when it has
// DWARF and PT_LOAD headers, as split debug files do. A file that cannot be
// opened is neither.
func inspect(path string) (complete, sufficient bool) {
	f, err := elfx.Open(path)
	if err != nil {
		return false, false
	}
	defer f.Close()
	hasLoad := false
	for _, s := range f.Loads() {
		if s.Filesz > 0 {
			hasLoad = true
			break
		}
	}
	complete = hasLoad && f.HasSection(".text")
	sufficient = len(f.Loads()) > 0 && f.HasSection(".debug_info")
	return complete, sufficient
}
