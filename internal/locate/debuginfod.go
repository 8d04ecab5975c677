package locate

import (
	"context"
	"errors"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate/debuginfod"
)

// Debuginfod asks debuginfod servers by GNU build id: the debuginfo file
// first (a separate debug file, or an unstripped binary: the protocol allows
// either, and both are accepted), then the executable when there is no
// debuginfo or it has no DWARF.
type Debuginfod struct {
	Client *debuginfod.Client
}

func (Debuginfod) Name() string { return SourceDebuginfod }

func (d Debuginfod) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	if d.Client == nil || q.ID.GNU == "" {
		return nil, nil
	}
	var out []Candidate
	dbg, err := d.Client.Fetch(ctx, q.ID.GNU, debuginfod.DebugInfo)
	if err == nil {
		out = append(out, Candidate{Path: dbg})
		if hasDWARF(dbg) {
			return out, nil
		}
	} else if !errors.Is(err, frame.ErrNotFound) {
		// After a timeout or failure the same servers would likely cost
		// the timeout again: no second request.
		return nil, err
	}
	bin, berr := d.Client.Fetch(ctx, q.ID.GNU, debuginfod.Executable)
	if berr == nil {
		out = append(out, Candidate{Path: bin})
	} else if len(out) == 0 && !errors.Is(berr, frame.ErrNotFound) {
		return nil, berr
	}
	return out, nil
}

func hasDWARF(p string) bool {
	f, err := elfx.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.HasSection(".debug_info")
}
