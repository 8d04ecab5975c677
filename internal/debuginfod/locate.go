package debuginfod

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/symbol"
)

// Locate implements symbolize.Locator. It prefers the debug file; it also
// fetches the executable when the debug file alone cannot serve lookups
// (no DWARF, so symbolization falls back to the executable's symbol table
// or pclntab, or no PT_LOAD headers for address math). When the server has
// no debug file, the executable alone is returned.
func (c *Client) Locate(ctx context.Context, buildID string) (binPath, debugPath string, err error) {
	dbg, err := c.Fetch(ctx, buildID, DebugInfo)
	if err != nil {
		// Only a clean "no such file" is worth a second request: after a
		// timeout or failure the same server would likely cost Timeout again.
		if !errors.Is(err, symbol.ErrNotFound) {
			return "", "", err
		}
		bin, berr := c.Fetch(ctx, buildID, Executable)
		if berr != nil {
			if errors.Is(berr, symbol.ErrNotFound) {
				return "", "", err
			}
			return "", "", berr
		}
		return bin, "", nil
	}
	if !needsExecutable(dbg) {
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

// needsExecutable reports whether a debuginfo file lacks DWARF or program
// headers. A file that cannot be opened is treated as lacking both.
func needsExecutable(path string) bool {
	f, err := elfx.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	return !f.HasSection(".debug_info") || len(f.Loads()) == 0
}
