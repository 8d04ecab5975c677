package pdict

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"
)

// Adding the same things twice, or to a re-opened dictionary, reuses entries.
func TestDedup(t *testing.T) {
	pd := pprofile.NewProfiles()
	x := New(pd.Dictionary())
	a := x.AttrStr("k", "v")
	fn := x.Function("f", "_Z1fv", "f.c", 3)
	m := x.Mapping(Mapping{Start: 1, Limit: 2, File: "/bin/x", Attrs: []int32{a}})
	l := x.Location(Location{Mapping: m, Address: 0x10, Attrs: []int32{a}, Lines: []Line{{Function: fn, Line: 4}}})
	s := x.Stack([]int32{l, l})

	y := New(pd.Dictionary())
	if y.AttrStr("k", "v") != a || y.Function("f", "_Z1fv", "f.c", 3) != fn ||
		y.Mapping(Mapping{Start: 1, Limit: 2, File: "/bin/x", Attrs: []int32{a}}) != m ||
		y.Location(Location{Mapping: m, Address: 0x10, Attrs: []int32{a}, Lines: []Line{{Function: fn, Line: 4}}}) != l ||
		y.Stack([]int32{l, l}) != s {
		t.Fatal("re-indexed dictionary did not find existing entries")
	}
	if y.Location(Location{Mapping: m, Address: 0x11}) == l || y.AttrInt("k", 1) == a || y.AttrBool("k", true) == a {
		t.Fatal("distinct entries were merged")
	}
	d := pd.Dictionary()
	if d.StringTable().At(0) != "" || d.LocationTable().Len() != 3 || d.StackTable().Len() != 2 {
		t.Fatalf("tables: %d strings, %d locations, %d stacks", d.StringTable().Len(), d.LocationTable().Len(), d.StackTable().Len())
	}
	if v, ok := y.FindAttr(d.LocationTable().At(int(l)).AttributeIndices(), "k"); !ok || v.Str() != "v" {
		t.Fatal("FindAttr")
	}
}
