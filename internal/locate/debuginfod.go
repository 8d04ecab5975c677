package locate

import (
	"context"
	"errors"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate/debuginfod"
)

// Debuginfod asks debuginfod servers by GNU build id: the debuginfo file
// first (a separate debug file, or an unstripped binary: the protocol allows
// either, and both are accepted), then the executable when there is no
// debuginfo or it has no DWARF. A download still running after Wait (from
// the query's Since, see Query) is frame.ErrPending: it goes on in the
// client, and a later query gets the file.
type Debuginfod struct {
	Client *debuginfod.Client
	Wait   time.Duration
}

func (Debuginfod) Name() string { return SourceDebuginfod }

func (d Debuginfod) Find(ctx context.Context, q *Query) ([]Candidate, error) {
	if d.Client == nil || q.ID.GNU == "" {
		return nil, nil
	}
	var out []Candidate
	w := debuginfod.Wait{From: q.Since, For: d.Wait}
	dbg, err := d.Client.FetchWait(ctx, q.ID.GNU, debuginfod.DebugInfo, w)
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
	bin, berr := d.Client.FetchWait(ctx, q.ID.GNU, debuginfod.Executable, w)
	switch {
	case berr == nil:
		out = append(out, Candidate{Path: bin})
	case errors.Is(berr, frame.ErrPending):
		return out, berr // the chain keeps what was found, and knows more may come
	case len(out) == 0 && !errors.Is(berr, frame.ErrNotFound):
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
