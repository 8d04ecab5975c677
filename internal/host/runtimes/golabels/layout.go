package golabels

import (
	"fmt"
	"go/version"
)

// Layout is what reading a Go process's goroutine labels needs: where the
// BPF program finds the running goroutine's labels pointer, and how the
// label set it points at is laid out.
type Layout struct {
	// TLSG is g's slot relative to the thread pointer (amd64: fs base).
	TLSG int64
	// GM, MCurg and GLabels are offsetof(runtime.g, m),
	// offsetof(runtime.m, curg) and offsetof(runtime.g, labels).
	GM, MCurg, GLabels uint32
	// Slice: the label set is runtime/pprof's labelMap{Set{List []Label}}
	// (Go 1.24+); else it is a *map[string]string (Go 1.9-1.23).
	Slice bool
}

// Oldest and newest Go releases whose layout is known here. runtime.g and
// runtime.m have no exported layout: a binary's DWARF gives their offsets
// (offsetsFromDWARF); a stripped one's come from this table, for the
// releases whose offsets are known (TestOffsetsMatchDWARF checks the
// table against the DWARF of the fixture built by each Go installed).
const (
	oldestGo = "go1.17"
	newestGo = "go1.26"
)

// LayoutFor returns the layout of Go release v ("go1.26.8") on amd64, the
// TLS slot aside (it depends on the binary: see tlsSlot). table is false
// when the release's field offsets are not in the table: only a binary
// with DWARF can be read then.
func LayoutFor(v string) (l Layout, table bool, err error) {
	if !version.IsValid(v) {
		return Layout{}, false, fmt.Errorf("go version %q: %w", v, ErrUnsupported)
	}
	lang := version.Lang(v)
	if version.Compare(lang, oldestGo) < 0 || version.Compare(lang, newestGo) > 0 {
		return Layout{}, false, fmt.Errorf("%s outside %s-%s: %w", v, oldestGo, newestGo, ErrUnsupported)
	}
	l = Layout{TLSG: -8, GM: 48, MCurg: 192}
	l.Slice = version.Compare(lang, "go1.24") >= 0
	switch lang {
	case "go1.25":
		return l, false, nil // not known here: DWARF only
	case "go1.26":
		l.MCurg = 184 // m lost a word before curg
	}
	switch {
	case version.Compare(lang, "go1.21") < 0:
		l.GLabels = 360
	case version.Compare(lang, "go1.23") < 0:
		l.GLabels = 344
	default:
		l.GLabels = 352
	}
	return l, true, nil
}
