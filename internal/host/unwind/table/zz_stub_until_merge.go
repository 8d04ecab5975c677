// Package table is being written on branch unwind-tables; this stub carries
// only its API so that the BPF side compiles until that branch is merged.
// Delete this file when merging unwind-tables.
package table

import (
	"debug/elf"
	"errors"

	"github.com/profsym/profsym/internal/elfx"
)

type CFARule uint8

const (
	CFAUndefined CFARule = iota
	CFASP
	CFAFP
	CFAPLT
)

type Kind uint8

const (
	KindNormal Kind = iota
	KindEnd
	KindSignal
	KindFallback
)

type Row struct {
	PC        uint64
	Kind      Kind
	CFA       CFARule
	CFAOffset int32
	FPSaved   bool
	FPOffset  int32
	RAOffset  int32
}

type Table struct {
	Arch   elf.Machine
	Source string
	Rows   []Row
}

type Options struct{ MaxRows int }

func Build(f *elfx.File, opt Options) (*Table, error) {
	return nil, errors.New("table: builder not merged yet")
}
