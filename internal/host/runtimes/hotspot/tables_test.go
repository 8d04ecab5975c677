package hotspot

import (
	"bufio"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
)

// testdata/jdkN.tables hold what the tables of Debian's OpenJDK 8, 11,
// 17, 21, 26 and 27 and Temurin 25 say about the types profsym reads
// (dumped from running JVMs by TestDumpTables): "F Type::_field offset
// [width]", "F Type::_field static @linkaddr", "T Type size", "I name
// value". The width, from the field's C type, is in the newer dumps.

type tableDump struct {
	fields []dumpField
	types  map[string]uint64
	ints   map[string]int64
}

type dumpField struct {
	typ, name string
	static    bool
	value     uint64
	width     uint8
}

func readDump(t testing.TB, version int) tableDump {
	t.Helper()
	f, err := os.Open("testdata/jdk" + strconv.Itoa(version) + ".tables")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := tableDump{types: map[string]uint64{}, ints: map[string]int64{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		switch w[0] {
		case "F":
			i := strings.LastIndex(w[1], "::")
			df := dumpField{typ: w[1][:i], name: w[1][i+2:]}
			if w[2] == "static" {
				df.static = true
				df.value, _ = strconv.ParseUint(strings.TrimPrefix(w[3], "@0x"), 16, 64)
			} else {
				df.value, _ = strconv.ParseUint(w[2], 10, 64)
				if len(w) > 3 {
					n, _ := strconv.ParseUint(w[3], 10, 8)
					df.width = uint8(n)
				}
			}
			d.fields = append(d.fields, df)
		case "T":
			d.types[w[1]], _ = strconv.ParseUint(w[2], 10, 64)
		case "I":
			d.ints[w[1]], _ = strconv.ParseInt(w[2], 10, 64)
		}
	}
	return d
}

// image lays the tables of d out in process memory as libjvm does: the
// nineteen variables that describe them first (in tableSymbols order),
// then the tables, their names and the statics. libjvm is "loaded" at the
// arena's base.
type image struct {
	a     *arena
	syms  tableSyms
	bias  uint64
	loads []elfx.Segment
}

const (
	structStride = 48 // typeName, fieldName, typeString, isStatic, offset, address
	typeStride   = 40 // typeName, superclassName, isOop, isInteger, isUnsigned, size
	constStride  = 16 // name, value
	imageBase    = uint64(0x7f1200000000)
)

func buildImage(d tableDump, version int) *image {
	a := newArena(imageBase, 1<<20)
	im := &image{a: a, syms: tableSyms{}, bias: imageBase, loads: []elfx.Segment{{Memsz: 1 << 20, Filesz: 1 << 20}}}
	all := append(append([]string(nil), tableSymbols...), optionalSymbols...)
	vars := a.alloc(8 * len(all))
	for i, n := range all {
		im.syms[n] = vars + uint64(8*i) - imageBase
	}
	ctype := map[uint8]string{1: "u1", 2: "uint16_t", 4: "int", 8: "address"}
	set := func(name string, v uint64) { a.u64(im.syms[name]+imageBase, v) }
	names := map[string]uint64{}
	str := func(s string) uint64 {
		if p, ok := names[s]; ok {
			return p
		}
		names[s] = a.cstring(s)
		return names[s]
	}
	structs := a.alloc(structStride * (len(d.fields) + 1))
	for i, f := range d.fields {
		e := structs + uint64(i*structStride)
		a.u64(e, str(f.typ))
		a.u64(e+8, str(f.name))
		if f.static {
			v := a.alloc(8)
			if n := f.typ + "::" + f.name; n == "Abstract_VM_Version::_vm_major_version" || n == "JDK_Version::_current" {
				a.u32(v, uint32(version)) // JDK_Version's _major is its first byte
			}
			a.u32(e+24, 1)
			a.u64(e+40, v)
		} else {
			a.u64(e+32, f.value)
		}
		if t, ok := ctype[f.width]; ok {
			a.u64(e+16, str(t))
		}
	}
	types := a.alloc(typeStride * (len(d.types) + 1))
	i := 0
	for n, size := range d.types {
		e := types + uint64(i*typeStride)
		a.u64(e, str(n))
		a.u64(e+32, size)
		i++
	}
	ints := a.alloc(constStride * (len(d.ints) + 1))
	i = 0
	for n, v := range d.ints {
		e := ints + uint64(i*constStride)
		a.u64(e, str(n))
		a.u32(e+8, uint32(int32(v)))
		i++
	}
	longs := a.alloc(constStride)
	set("gHotSpotVMStructs", structs)
	set("gHotSpotVMStructEntryArrayStride", structStride)
	set("gHotSpotVMStructEntryFieldNameOffset", 8)
	set("gHotSpotVMStructEntryTypeStringOffset", 16)
	set("gHotSpotVMStructEntryIsStaticOffset", 24)
	set("gHotSpotVMStructEntryOffsetOffset", 32)
	set("gHotSpotVMStructEntryAddressOffset", 40)
	set("gHotSpotVMTypes", types)
	set("gHotSpotVMTypeEntryArrayStride", typeStride)
	set("gHotSpotVMTypeEntrySizeOffset", 32)
	set("gHotSpotVMIntConstants", ints)
	set("gHotSpotVMIntConstantEntryArrayStride", constStride)
	set("gHotSpotVMIntConstantEntryValueOffset", 8)
	set("gHotSpotVMLongConstants", longs)
	set("gHotSpotVMLongConstantEntryArrayStride", constStride)
	set("gHotSpotVMLongConstantEntryValueOffset", 8)
	a.m.b = a.m.b[:(a.top-imageBase+pageSize-1)&^(pageSize-1)] // whole pages, as mapped
	return im
}

func (im *image) layout() (*layout, error) {
	t, err := readTables(im.a.m, im.syms, im.bias, wantTypes)
	if err != nil {
		return nil, err
	}
	return newLayout(t, im.loads, im.bias, im.a.m)
}

// The layouts the real tables give: JDK 17's must be the one the naming
// tests build by hand; 11 and 21 differ where their classes do.
func TestLayoutFromTables(t *testing.T) {
	for _, v := range []int{8, 11, 17, 21, 25, 26, 27} {
		l, err := buildImage(readDump(t, v), v).layout()
		if err != nil {
			t.Fatalf("JDK %d: %v", v, err)
		}
		// 25 exports only the call stub's return address of StubRoutines.
		stubs := 40
		if v == 8 {
			stubs = 10
		} else if v >= 25 {
			stubs = 1
		}
		if l.version != v || len(l.stubs) < stubs || l.ifMethod != -3 || l.callStubRet == 0 {
			t.Errorf("JDK %d: %+v", v, l)
		}
		if v > 8 && (l.ifBCP != -8 || l.ccLow == 0 || l.ccHeap != 0) {
			t.Errorf("JDK %d: interpreter slots or code heaps: %+v", v, l)
		}
		// 8 and 23+ keep offsets from the blob; 23+ narrowed
		// frame_complete_offset and moved the debug information.
		if l.codeOffsets != (v == 8 || v >= 23) || (l.completeWidth == 2) != (v >= 23) ||
			(l.nmDebug == nmImmutable) != (v >= 23) || l.mutableData != (v >= 25) || l.scopesPointer != (v > 8 && v < 23) {
			t.Errorf("JDK %d: code offsets %v, frame_complete_offset of %d bytes, debug information %d, mutable data %v, scopes pointer %v",
				v, l.codeOffsets, l.completeWidth, l.nmDebug, l.mutableData, l.scopesPointer)
		}
		switch v {
		case 8:
			if l.ifBCP != -7 || l.ccHeap == 0 || l.ikSourceFile == 0 || l.symLength != 0 || l.symBody != 8 || l.metaWidth != 4 {
				t.Errorf("JDK 8: bcp at -7, one code heap, source file in InstanceKlass, Symbol body at 8: %+v", l)
			}
		case 11:
			if l.ikSourceFile == 0 || l.cpSourceFile != 0 || l.symLength != 0 || l.gaData != 24 {
				t.Errorf("JDK 11: source file in InstanceKlass, Symbol length at 0, GrowableArray data at 24: %+v", l)
			}
		case 17:
			want := jdk17()
			got := *l
			got.stubs, want.stubs = nil, nil
			// The hand-made layout leaves the code cache fields out.
			got.ccHeaps, got.ccLow, got.ccHigh, got.gaLen, got.gaData = 0, 0, 0, 0, 0
			got.heapMemory, got.heapSegmap, got.heapLog2Seg, got.vsLowBoundary, got.vsHighBoundary = 0, 0, 0, 0, 0
			got.interpCode, got.sqBuffer, got.sqLimit, got.callStubRet = 0, 0, 0, 0
			if !reflect.DeepEqual(got, *want) {
				t.Errorf("JDK 17:\n got %+v\nwant %+v", got, *want)
			}
		case 21:
			if l.blobCodeBegin != 8 || l.cmHasLineTable != 1 || l.u5x() != 1 {
				t.Errorf("JDK 21: %+v", l)
			}
		}
	}
}

// Tables a process forges: each fails with a layout error or a read
// error, within the read budget, and never hangs.
func TestHostileTables(t *testing.T) {
	for _, tc := range []struct {
		name  string
		forge func(im *image)
	}{
		{"stride zero", func(im *image) { im.a.u64(im.syms["gHotSpotVMStructEntryArrayStride"]+im.bias, 0) }},
		{"stride huge", func(im *image) { im.a.u64(im.syms["gHotSpotVMStructEntryArrayStride"]+im.bias, 1<<40) }},
		{"column past stride", func(im *image) { im.a.u64(im.syms["gHotSpotVMStructEntryAddressOffset"]+im.bias, 44) }},
		{"type column past stride", func(im *image) { im.a.u64(im.syms["gHotSpotVMStructEntryTypeStringOffset"]+im.bias, 48) }},
		{"wild table", func(im *image) { im.a.u64(im.syms["gHotSpotVMStructs"]+im.bias, 0xdeadbeef000) }},
		{"no end", func(im *image) {
			// Entries that never end: the parse stops at maxEntries.
			n := maxEntries + 16
			im.a.m.b = append(im.a.m.b, make([]byte, structStride*n+64)...)
			e := im.a.alloc(structStride * n)
			x := im.a.cstring("X")
			for i := range n {
				im.a.u64(e+uint64(i*structStride), x)
				im.a.u64(e+uint64(i*structStride)+8, x)
			}
			im.a.u64(im.syms["gHotSpotVMStructs"]+im.bias, e)
		}},
		{"cyclic", func(im *image) {
			// The table pointer points at itself.
			at := im.syms["gHotSpotVMStructs"] + im.bias
			im.a.u64(at, at)
		}},
		{"endless string", func(im *image) {
			base, _ := im.a.m.U64(im.syms["gHotSpotVMStructs"] + im.bias)
			im.a.m.b = append(im.a.m.b, make([]byte, 1<<20+64)...)
			s := im.a.alloc(1 << 20)
			for i := range 1 << 20 {
				im.a.m.b[s-im.a.m.base+uint64(i)] = 'A'
			}
			im.a.u64(base, s)
		}},
		{"offset outside type", func(im *image) {
			base, _ := im.a.m.U64(im.syms["gHotSpotVMStructs"] + im.bias)
			for e := base; ; e += structStride {
				p, _ := im.a.m.U64(e)
				n, _ := im.a.m.CString(p, 64)
				if p == 0 {
					break
				}
				if n == "CodeBlob" {
					im.a.u64(e+32, 1<<20)
				}
			}
		}},
		{"frame_complete_offset a pointer", func(im *image) {
			// A width the walker cannot read: refused, not misread.
			base, _ := im.a.m.U64(im.syms["gHotSpotVMStructs"] + im.bias)
			for e := base; ; e += structStride {
				p, _ := im.a.m.U64(e)
				if p == 0 {
					break
				}
				f, _ := im.a.m.U64(e + 8)
				if n, _ := im.a.m.CString(f, 64); n == "_frame_complete_offset" {
					im.a.u64(e+16, im.a.cstring("address"))
				}
			}
		}},
		{"static outside libjvm", func(im *image) {
			base, _ := im.a.m.U64(im.syms["gHotSpotVMStructs"] + im.bias)
			for e := base; ; e += structStride {
				p, _ := im.a.m.U64(e)
				if p == 0 {
					break
				}
				if s, _ := im.a.m.U32(e + 24); s != 0 {
					im.a.u64(e+40, 0x10)
				}
			}
		}},
		{"unsupported version", func(im *image) {
			base, _ := im.a.m.U64(im.syms["gHotSpotVMStructs"] + im.bias)
			for e := base; ; e += structStride {
				p, _ := im.a.m.U64(e)
				if p == 0 {
					break
				}
				if n, _ := im.a.m.CString(p, 64); n == "Abstract_VM_Version" {
					f, _ := im.a.m.U64(e + 8)
					if fn, _ := im.a.m.CString(f, 64); fn == "_vm_major_version" {
						addr, _ := im.a.m.U64(e + 40)
						im.a.u32(addr, 99)
					}
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im := buildImage(readDump(t, 25), 25)
			tc.forge(im)
			im.a.m.bytes = 0
			_, err := im.layout()
			if err == nil {
				t.Fatal("forged tables accepted")
			}
			if !errors.Is(err, errLayout) && !errors.Is(err, errNotReady) && !strings.Contains(err.Error(), "read") {
				t.Errorf("error %v", err)
			}
			if im.a.m.bytes > maxTableBytes+8<<10 {
				t.Errorf("read %d bytes, bound %d", im.a.m.bytes, maxTableBytes)
			}
			t.Logf("%v (%d bytes read)", err, im.a.m.bytes)
		})
	}
}
