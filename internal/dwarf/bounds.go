package dwarf

import (
	"context"
	"fmt"

	"github.com/profsym/profsym/internal/frame"
)

// Bounds calls fn with every address at which Lookup's answer may change:
// the ends of the unit index's ranges, of each unit's line sequences and
// function spans, and each line row's address. Between two neighbouring
// bounds every Lookup answers the same, which is what lets a symbol index
// store one answer per stretch. It parses every indexed unit; an answer
// that would be partial (units left unindexed by a limit, a unit that does
// not parse, a split unit that cannot be read) fails it, since an index of
// it would keep the gap for good. Addresses may repeat and come unordered.
// Parsed units stay parsed (the index's lookups read them): past maxParsed
// bytes of them (0: no bound) it fails with frame.ErrLimitExceeded rather
// than hold a kernel's worth of DWARF.
func (t *Table) Bounds(ctx context.Context, maxParsed int64, fn func(uint64)) error {
	if t.limitErr != nil {
		return t.limitErr
	}
	seen := make(map[int32]bool, len(t.units))
	for _, r := range t.index {
		fn(r.lo)
		fn(r.hi)
		if seen[r.u] {
			continue
		}
		seen[r.u] = true
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := t.fullOf(t.units[r.u])
		if err != nil {
			return err
		}
		if d.missing != nil {
			return d.missing
		}
		if n := t.parsed.Load(); maxParsed > 0 && n > maxParsed {
			return fmt.Errorf("parsed units hold %d bytes, more than %d: %w", n, maxParsed, frame.ErrLimitExceeded)
		}
		for _, s := range d.seqs {
			fn(s.lo)
			fn(s.hi)
		}
		for i := range d.rows {
			fn(d.rows[i].addr)
		}
		for _, s := range d.spans {
			fn(s.lo)
			fn(s.hi)
		}
	}
	return nil
}
