package hotspot

import (
	"errors"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
)

type nopMap struct{}

func (nopMap) Put(key, value any) error { return nil }
func (nopMap) Delete(key any) error     { return nil }

func newTestRuntime(t *testing.T, j *fakeJVM, cfg runtimes.Config) *Runtime {
	t.Helper()
	r := New(cfg, nopMap{}, nil, nil)
	r.procs[1] = j.proc(1)
	return r
}

func interp(m *fakeJVM, method uint64, bci int) runtimes.Frame {
	cm, _ := m.m.U64(method + m.l.methodConst)
	b := uint64(bci)
	if bci < 0 {
		b = bciNone
	}
	return runtimes.Frame{Kind: KindInterpreted, Ptr: method, Aux: b | ((cm>>3)&0xffffffff)<<32}
}

func TestInterpretedNames(t *testing.T) {
	j := newFakeJVM()
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17}, [2]int{2, 18}, [2]int{12, 19}, [2]int{26, 18}, [2]int{35, 21})
	r := newTestRuntime(t, j, runtimes.Config{})
	for _, tc := range []struct {
		bci  int
		line uint32
	}{{0, 17}, {1, 17}, {12, 19}, {20, 19}, {26, 18}, {30, 18}, {35, 21}, {39, 21}, {-1, 0}, {40, 0}} {
		sym, err := r.Name(1, interp(j, hot, tc.bci))
		if err != nil {
			t.Fatalf("bci %d: %v", tc.bci, err)
		}
		want := frame.Frame{Name: "fixture.Chain.hot", File: "Chain.java", Line: tc.line}
		if len(sym.Frames) != 1 || sym.Frames[0] != want || sym.Type != frame.TypeJVM {
			t.Errorf("bci %d: %+v, want %+v", tc.bci, sym, want)
		}
	}
}

// A Method freed with its class and reused: a name cached for it must not
// be handed out again, and a frame whose check no longer matches is bad.
func TestInterpretedRevalidated(t *testing.T) {
	j := newFakeJVM()
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17})
	other := j.method("other/Klass", "Klass.java", "run", 10, [2]int{0, 5})
	r := newTestRuntime(t, j, runtimes.Config{})
	f := interp(j, hot, 0)
	if _, err := r.Name(1, f); err != nil {
		t.Fatal(err)
	}
	// The class unloads; its Method's memory now holds another method.
	cm, _ := j.m.U64(other + j.l.methodConst)
	j.u64(hot+j.l.methodConst, cm)
	if _, err := r.Name(1, f); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("cached name of a freed method: err %v, want %v", err, runtimes.ErrBadFrame)
	}
	sym, err := r.Name(1, interp(j, hot, 0))
	if err != nil || sym.Frames[0].Name != "other.Klass.run" {
		t.Errorf("the new method: %+v, %v", sym, err)
	}
	// A process that exited before its report: what was named stands,
	// nothing else can be.
	f = interp(j, hot, 0)
	j.m.gone = true
	if sym, err := r.Name(1, f); err != nil || sym.Frames[0].Name != "other.Klass.run" {
		t.Errorf("cached name after exit: %+v, %v", sym, err)
	}
	if _, err := r.Name(1, interp(j, hot, 1)); !errors.Is(err, runtimes.ErrProcessGone) {
		t.Errorf("new frame after exit: %v", err)
	}
	r.Forget(1)
	if _, err := r.Name(1, f); !errors.Is(err, runtimes.ErrNotAttached) {
		t.Errorf("forgotten process: %v", err)
	}
}

// fakeLayouts are the layouts the naming tests build JVM structures with:
// JDK 17's by hand, and those the tables of 8 (debug information by
// offsets in the nmethod), 25 and 27 (immutable and mutable data) give.
func fakeLayouts(t *testing.T) map[string]*layout {
	return map[string]*layout{"jdk17": jdk17(), "jdk8": tablesLayout(t, 8), "jdk25": tablesLayout(t, 25), "jdk27": tablesLayout(t, 27)}
}

func TestCompiledInlined(t *testing.T) {
	for name, l := range fakeLayouts(t) {
		t.Run(name, func(t *testing.T) { testCompiledInlined(t, newFakeJVMOf(l)) })
	}
}

func testCompiledInlined(t *testing.T, j *fakeJVM) {
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17}, [2]int{12, 19})
	b := j.method("fixture/Chain", "Chain.java", "b", 9, [2]int{0, 25}, [2]int{5, 26})
	a := j.method("fixture/Chain", "Chain.java", "a", 22, [2]int{0, 30}, [2]int{13, 33})
	scopes := []scope{{method: a, bci: 14, caller: -1}, {method: b, bci: 1, caller: 0}, {method: hot, bci: 12, caller: 1}}
	nm := j.nmethod(a, 77, scopes, map[int32]int{0x10: 0, 0x40: 2, 0x80: 1})
	r := newTestRuntime(t, j, runtimes.Config{})
	names := func(f runtimes.Frame) string {
		sym, err := r.Name(1, f)
		if err != nil {
			return "error: " + err.Error()
		}
		var s []string
		for _, fr := range sym.Frames {
			s = append(s, fr.Name[len("fixture.Chain."):]+":"+itoa(fr.Line))
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		off  uint32
		leaf bool
		want string
	}{
		{0x10, false, "a:33"},             // a return address: its own PcDesc
		{0x40, false, "hot:19 b:25 a:33"}, // inlined
		{0x30, true, "hot:19 b:25 a:33"},  // interrupted: the next PcDesc
		{0x40, true, "b:25 a:33"},         // interrupted at a PcDesc: the next one
		{0x90, true, "b:25 a:33"},         // after the last: the last before
	} {
		aux := uint64(tc.off) | uint64(77)<<32
		if tc.leaf {
			aux |= uint64(pcLeaf)
		}
		if got := names(runtimes.Frame{Kind: KindCompiled, Ptr: nm, Aux: aux}); got != tc.want {
			t.Errorf("offset %#x leaf %v: %s, want %s", tc.off, tc.leaf, got, tc.want)
		}
	}
	// Another compilation at the same address: flushed since sampled.
	f := runtimes.Frame{Kind: KindCompiled, Ptr: nm, Aux: 0x40 | uint64(77)<<32}
	j.u32(nm+j.l.nmCompileID, 78)
	if _, err := r.Name(1, f); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("flushed nmethod: %v", err)
	}
	if _, err := r.Name(1, runtimes.Frame{Kind: KindCompiled, Ptr: nm, Aux: 0x10 | uint64(77)<<32}); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("flushed nmethod, never named: %v", err)
	}
}

func TestCompiledWithoutScopes(t *testing.T) {
	for name, l := range fakeLayouts(t) {
		t.Run(name, func(t *testing.T) { testCompiledWithoutScopes(t, newFakeJVMOf(l)) })
	}
}

func testCompiledWithoutScopes(t *testing.T, j *fakeJVM) {
	native := j.method("fixture/Chain", "Chain.java", "viaNative", 0)
	nm := j.nmethod(native, 5, nil, map[int32]int{0x20: -1})
	r := newTestRuntime(t, j, runtimes.Config{})
	sym, err := r.Name(1, runtimes.Frame{Kind: KindCompiled, Ptr: nm, Aux: 0x20 | 5<<32})
	want := frame.Frame{Name: "fixture.Chain.viaNative", File: "Chain.java"}
	if err != nil || len(sym.Frames) != 1 || sym.Frames[0] != want {
		t.Errorf("%+v, %v; want %+v", sym, err, want)
	}
}

func TestStubNames(t *testing.T) {
	j := newFakeJVM()
	l := j.l
	blob := j.alloc(4096)
	code := blob + 256
	j.u64(blob+l.blobName, j.cstring("StubRoutines (1)"))
	j.u64(blob+l.blobCodeBegin, code)
	j.u64(blob+l.blobCodeEnd, code+2048)
	// Entries of two routines, in statics of "libjvm" (bias 0 here).
	s1, s2 := j.alloc(8), j.alloc(8)
	j.u64(s1, code+0x100)
	j.u64(s2, code+0x400)
	l.stubs["jint_arraycopy"], l.stubs["jlong_arraycopy"] = s1, s2
	pr := j.proc(1)
	pr.callStubRet = code + 0x40
	r := New(runtimes.Config{}, nopMap{}, nil, nil)
	r.procs[1] = pr
	for off, want := range map[uint32]string{
		0x40:  "StubRoutines (1) [call_stub]",
		0x20:  "StubRoutines (1)",
		0x180: "StubRoutines (1) [jint_arraycopy]",
		0x400: "StubRoutines (1) [jlong_arraycopy]",
		2100:  "StubRoutines (1)",
	} {
		sym, err := r.Name(1, runtimes.Frame{Kind: KindStub, Ptr: blob, Aux: uint64(off)})
		if err != nil || len(sym.Frames) != 1 || sym.Frames[0].Name != want {
			t.Errorf("offset %#x: %+v, %v; want %s", off, sym, err, want)
		}
	}
}

// Names are cut at MaxNameBytes; a cycle in the scopes, a scope or
// PcDesc table that claims too much, pointers to nowhere: errors, no hang.
func TestHostileNames(t *testing.T) {
	j := newFakeJVM()
	long := strings.Repeat("x", 5000)
	m := j.method("pkg/"+long, "F.java", "m", 4, [2]int{0, 1})
	r := newTestRuntime(t, j, runtimes.Config{MaxNameBytes: 64})
	sym, err := r.Name(1, interp(j, m, 0))
	if err != nil || len(sym.Frames[0].Name) > 64 || !strings.HasSuffix(sym.Frames[0].Name, "...") {
		t.Errorf("long name: %q, %v", sym.Frames[0].Name, err)
	}

	a := j.method("p/A", "A.java", "a", 4, [2]int{0, 1})
	nm := j.nmethod(a, 9, []scope{{method: a, bci: 0, caller: -1}, {method: a, bci: 1, caller: 0}}, map[int32]int{0x10: 1})
	// Make the second scope its own caller.
	data, _ := j.m.U64(nm + j.l.nmScopesData)
	second := uint64(1 + len(u5(0, 0))*6)
	j.put(data+second, u5(0, uint32(second)))
	if _, err := r.Name(1, runtimes.Frame{Kind: KindCompiled, Ptr: nm, Aux: 0x10 | 9<<32}); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("cyclic scopes: %v", err)
	}
	nm2 := j.nmethod(a, 10, nil, map[int32]int{0x10: -1})
	j.u32(nm2+j.l.nmDepsOff, 1<<30)
	if _, err := r.Name(1, runtimes.Frame{Kind: KindCompiled, Ptr: nm2, Aux: 0x10 | 10<<32}); !errors.Is(err, runtimes.ErrBadFrame) {
		t.Errorf("PcDescs of a GB: %v", err)
	}
	for _, f := range []runtimes.Frame{
		{Kind: KindInterpreted, Ptr: 0x1000, Aux: 0},
		{Kind: KindInterpreted, Ptr: 0x7f0000000003},
		{Kind: KindCompiled, Ptr: 0xdead0000, Aux: 1 << 32},
		{Kind: KindStub, Ptr: 0x7f00000ffff8},
		{Kind: 15, Ptr: m},
	} {
		if _, err := r.Name(1, f); err == nil {
			t.Errorf("%+v named", f)
		}
	}
	if j.m.bytes > 4<<20 {
		t.Errorf("read %d bytes naming a few frames", j.m.bytes)
	}
}

// The caches hold at most MaxNames entries each.
func TestCachesBounded(t *testing.T) {
	j := newFakeJVM()
	r := newTestRuntime(t, j, runtimes.Config{MaxNames: 16})
	for i := 0; i < 100; i++ {
		m := j.method("p/C", "C.java", "m"+itoa(uint32(i)), 4, [2]int{0, i + 1})
		if _, err := r.Name(1, interp(j, m, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if n, m := r.names.Stats().Entries, r.methods.Stats().Entries; n > 16 || m > 16 {
		t.Errorf("%d names, %d methods cached, bound 16", n, m)
	}
	r.Forget(1)
	if n, m := r.names.Stats().Entries, r.methods.Stats().Entries; n != 0 || m != 0 {
		t.Errorf("%d names, %d methods left after Forget", n, m)
	}
}

func itoa(v uint32) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}
