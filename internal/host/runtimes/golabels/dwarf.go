package golabels

import (
	"debug/dwarf"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
)

// maxDWARFEntries bounds the entries looked at for runtime.g and
// runtime.m: the runtime's types come early in a Go binary's .debug_info.
const maxDWARFEntries = 1 << 21

// offsetsFromDWARF reads offsetof(runtime.g, m), offsetof(runtime.g,
// labels) and offsetof(runtime.m, curg) from f's DWARF, when it has one.
// The sections come through elfx, whose decompression is bounded.
func offsetsFromDWARF(f *elfx.File) (gm, glabels, mcurg uint32, err error) {
	sec := func(name string) []byte {
		b, _ := f.SectionData(name)
		return b
	}
	info, abbrev := sec(".debug_info"), sec(".debug_abbrev")
	if info == nil || abbrev == nil {
		return 0, 0, 0, fmt.Errorf("no DWARF")
	}
	d, err := dwarf.New(abbrev, nil, nil, info, sec(".debug_line"), nil, nil, sec(".debug_str"))
	if err != nil {
		return 0, 0, 0, err
	}
	for _, s := range []string{".debug_str_offsets", ".debug_addr", ".debug_line_str", ".debug_rnglists"} {
		if b := sec(s); b != nil {
			_ = d.AddSection(s, b)
		}
	}
	want := map[string][]string{"runtime.g": {"m", "labels"}, "runtime.m": {"curg"}}
	got := map[string]uint32{}
	r := d.Reader()
	for i := 0; i < maxDWARFEntries && len(got) < 3; i++ {
		e, err := r.Next()
		if err != nil {
			return 0, 0, 0, err
		}
		if e == nil {
			break
		}
		if e.Tag != dwarf.TagStructType {
			if e.Tag != dwarf.TagCompileUnit {
				r.SkipChildren()
			}
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		fields, ok := want[name]
		if !ok || !e.Children {
			r.SkipChildren()
			continue
		}
		for ; i < maxDWARFEntries; i++ {
			c, err := r.Next()
			if err != nil {
				return 0, 0, 0, err
			}
			if c == nil || c.Tag == 0 {
				break
			}
			fn, _ := c.Val(dwarf.AttrName).(string)
			off, ok := c.Val(dwarf.AttrDataMemberLoc).(int64)
			for _, w := range fields {
				if w == fn && ok && off >= 0 && off < 1<<16 {
					got[name+"."+fn] = uint32(off)
				}
			}
			if c.Children {
				r.SkipChildren()
			}
		}
	}
	if len(got) < 3 {
		return 0, 0, 0, fmt.Errorf("runtime.g/runtime.m fields not in DWARF (%d of 3)", len(got))
	}
	return got["runtime.g.m"], got["runtime.g.labels"], got["runtime.m.curg"], nil
}
