//go:build !linux

package locate

import "context"

// Proc reads live processes through /proc, which only Linux has: elsewhere
// it offers nothing.
type Proc struct {
	Root string
}

func (Proc) Name() string { return SourceProc }

func (Proc) Find(context.Context, *Query) ([]Candidate, error) { return nil, nil }
