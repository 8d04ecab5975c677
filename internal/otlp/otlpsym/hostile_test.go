package otlpsym

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// F1: build ids are validated at ingestion. A 1 MiB one, a non-hex one and
// a path-like one each get invalid_build_id without any lookup, and the
// healthy frame of the same batch is still named.
func TestInvalidBuildIDs(t *testing.T) {
	bin := fixture(t, "otlpsym-local")
	hot := inside(t, bin, "hot")
	bad := []fileIDs{
		{gnu: strings.Repeat("ab", 1<<19)},
		{gnu: "not-hex-at-all"},
		{gnu: "../../../../etc/passwd"},
		{htl: strings.Repeat("f", 4096)},
		{gnu: "abc"},
	}
	var frames []rawFrame
	for _, id := range bad {
		frames = append(frames, rawFrame{"/nonexistent", id, 0x1234, ""})
	}
	frames = append(frames, rawFrame{bin, idsOf(t, bin), hot, ""})
	pd, locs := rawProfile(frames...)
	s := newSym(t, defaults())
	st := s.Profiles(context.Background(), pd)
	for i := range bad {
		if got := reasonOf(pd, locs[i]); got != "invalid_build_id" {
			t.Errorf("bad id %d: reason %q, want invalid_build_id", i, got)
		}
	}
	if got := names(pd, locs[len(bad)]); len(got) == 0 || got[len(got)-1] != "hot" {
		t.Errorf("healthy frame: %v (stats %+v)", got, st)
	}
	// Nothing about the bad ids is remembered: no object numbers, no
	// located answers.
	for _, c := range s.Caches() {
		if (c.Name == "object_ids" || c.Name == "located") && c.Entries > 1 {
			t.Errorf("cache %s holds %d entries after one healthy object", c.Name, c.Entries)
		}
	}
	checkSamples(t, pd)
}

// F2: a debug-directory lookup takes only validated ids, so a build id made
// of "../" cannot reach a file outside the directory; and a file found
// under a valid id is used only if it carries that id (here: none).
func TestDebugDirsContainment(t *testing.T) {
	bin := fixture(t, "otlpsym-nobuildid", "-Wl,--build-id=none")
	hot := inside(t, bin, "hot")
	dir := t.TempDir()
	dbg := filepath.Join(dir, "debug")
	data, _ := os.ReadFile(bin)
	os.WriteFile(filepath.Join(dir, "secret"), data, 0o644)
	// filepath.Join(dbg, ".build-id", "..", "/../secret") is dir/secret.
	escape := "..//../secret"
	// A valid id whose file has no build id at all.
	valid := "0123456789abcdef0123456789abcdef01234567"
	p := filepath.Join(dbg, ".build-id", valid[:2], valid[2:]+".debug")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, data, 0o644)

	pd, locs := rawProfile(rawFrame{"/nonexistent", fileIDs{gnu: escape}, hot, ""}, rawFrame{"/nonexistent", fileIDs{gnu: valid}, hot, ""})
	opt := defaults()
	opt.Locate = locate.Config{Order: []string{locate.SourceDebugDirs}, DebugDirs: []string{dbg}}
	s := newSym(t, opt)
	s.Profiles(context.Background(), pd)
	for i, want := range []string{"invalid_build_id", "build_id_mismatch"} {
		if got := names(pd, locs[i]); len(got) > 0 {
			t.Errorf("frame %d named from a file it must not use: %v", i, got)
		}
		if got := reasonOf(pd, locs[i]); got != want {
			t.Errorf("frame %d: reason %q, want %q", i, got, want)
		}
	}
}

// F3: a mapping path is resolved inside local.root: "/../x" is root/x, and
// a symbolic link inside the root cannot lead out of it.
func TestLocalRootContainment(t *testing.T) {
	bin := fixture(t, "otlpsym-local")
	hot := inside(t, bin, "hot")
	ids := idsOf(t, bin)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	data, _ := os.ReadFile(bin)
	os.WriteFile(filepath.Join(dir, "x"), data, 0o755)
	os.Symlink(dir, filepath.Join(root, "usr/bin/up")) // absolute: means root+dir inside the root
	inRoot := filepath.Join(root, "usr/bin/prog")
	os.WriteFile(inRoot, data, 0o755)

	pd, locs := rawProfile(rawFrame{"/../x", ids, hot, ""}, rawFrame{"/usr/bin/up/x", ids, hot, ""},
		rawFrame{"/usr/bin/prog", ids, hot + 1, ""})
	opt := defaults()
	opt.Locate = locate.Config{Order: []string{locate.SourceLocal}, LocalRoot: root}
	s := newSym(t, opt)
	s.Profiles(context.Background(), pd)
	// The first two share the identity of the third: the object is found
	// once, inside the root, so all three are named from root/usr/bin/prog.
	// The escape attempts alone find nothing:
	pd2, locs2 := rawProfile(rawFrame{"/../x", ids, hot, ""}, rawFrame{"/usr/bin/up/x", ids, hot, ""})
	s2 := newSym(t, opt)
	s2.Profiles(context.Background(), pd2)
	for i := range locs2 {
		if got := names(pd2, locs2[i]); len(got) > 0 {
			t.Errorf("frame %d escaped the root: %v", i, got)
		}
		if got := reasonOf(pd2, locs2[i]); got != "no_debug_info" {
			t.Errorf("frame %d: reason %q", i, got)
		}
	}
	if got := names(pd, locs[2]); len(got) == 0 {
		t.Errorf("file inside the root not used: %q", reasonOf(pd, locs[2]))
	}
}

// F9: object numbers are never reused, so however many objects pass
// through, a cached answer for one binary never names another's frame.
// Before, numbers wrapped after 65,535 objects and B's frame was named
// from A's cache entry at the same address.
func TestObjectIDsNeverAlias(t *testing.T) {
	a := fixture(t, "otlpsym-local")
	b := fixture(t, "otlpsym-other", "-DOTHER=1", "-O0")
	x := inside(t, b, "main")
	wantA, wantB := engineNames(t, a, x), engineNames(t, b, x)
	if fmt.Sprint(wantA) == fmt.Sprint(wantB) {
		t.Fatalf("fixtures name %#x alike: %v", x, wantA)
	}
	for _, maxObjects := range []int{0, 3} { // default bound, and one that evicts all the time
		opt := Options{Demangle: true, Inlines: true, Lines: true, MaxObjects: maxObjects,
			Locate: locate.Config{Order: []string{locate.SourceLocal}}}
		s := newSym(t, opt)
		pd, locs := rawProfile(rawFrame{a, idsOf(t, a), x, ""})
		s.Profiles(context.Background(), pd)
		if got := names(pd, locs[0]); fmt.Sprint(got) != fmt.Sprint(wantA) {
			t.Fatalf("A: %v, want %v", got, wantA)
		}
		var junk []rawFrame
		for i := 0; i < 1<<16; i++ {
			junk = append(junk, rawFrame{"", fileIDs{gnu: fmt.Sprintf("%040x", i+1)}, 0x10, ""})
		}
		pd, _ = rawProfile(junk...)
		s.Profiles(context.Background(), pd)
		for _, c := range []struct {
			bin  string
			want []string
		}{{b, wantB}, {a, wantA}} {
			pd, locs = rawProfile(rawFrame{c.bin, idsOf(t, c.bin), x, ""})
			s.Profiles(context.Background(), pd)
			if got := names(pd, locs[0]); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("max_objects %d: %s at %#x named %v, want %v", maxObjects, filepath.Base(c.bin), x, got, c.want)
			}
		}
	}
}

// longNameBinary builds a program whose hot function's symbol is 500 KB
// long, as a hostile or generated binary can have.
func longNameBinary(t *testing.T) (bin, name string) {
	dir := t.TempDir()
	name = strings.Repeat("N", 500<<10)
	src := filepath.Join(dir, "long.c")
	os.WriteFile(src, []byte(`__attribute__((noinline)) int f(int x) __asm__("`+name+`");
__attribute__((noinline)) int f(int x) { for (int i = 0; i < 1000; i++) x = x * 31 + i; return x; }
int main(int c, char **v) { return f(c); }
`), 0o644)
	bin = filepath.Join(dir, "long")
	if out, err := exec.Command("gcc", "-O1", "-g", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	return bin, name
}

// A 500 KB function name is truncated to limits.max_name_bytes in profiles
// and logs, and the log attributes stay within max_attribute_bytes. Before,
// it became 4 MB of log attributes per record.
func TestLongNames(t *testing.T) {
	bin, name := longNameBinary(t)
	addr := inside(t, bin, name)
	ids := idsOf(t, bin)
	healthy := fixture(t, "otlpsym-local")
	hot := inside(t, healthy, "hot")
	for _, limit := range []int{0, 100} {
		opt := defaults()
		opt.Limits = Limits{MaxNameBytes: limit, MaxAttributeBytes: 10 * limit}
		s := newSym(t, opt)
		maxName := limit
		if maxName == 0 {
			maxName = frame.DefaultMaxNameBytes
		}
		maxAttr := 10 * limit
		if maxAttr == 0 {
			maxAttr = DefaultMaxAttributeBytes
		}

		pd, locs := rawProfile(rawFrame{bin, ids, addr, ""}, rawFrame{healthy, idsOf(t, healthy), hot, ""})
		s.Profiles(context.Background(), pd)
		got := names(pd, locs[0])
		if len(got) == 0 || len(got[0]) > maxName || !strings.HasPrefix(got[0], "NNNN") || !strings.HasSuffix(got[0], frame.TruncSuffix) {
			t.Errorf("limit %d: profile name of %d bytes", limit, len(strings.Join(got, "")))
		}
		if h := names(pd, locs[1]); len(h) == 0 || h[len(h)-1] != "hot" {
			t.Errorf("limit %d: healthy frame %v", limit, h)
		}

		var lf []LogFrame
		for i := 0; i < 50; i++ {
			lf = append(lf, LogFrame{BuildID: ids.gnu, Address: addr, File: bin, FrameType: "native"})
		}
		frames, _ := json.Marshal(lf)
		ld := plog.NewLogs()
		lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
		lr.Attributes().PutStr(LogAttrFrames, string(frames))
		lr.Attributes().PutStr("comm", "long")
		s.Logs(context.Background(), ld)
		total := 0
		for k, v := range lr.Attributes().All() {
			if k == LogAttrFrames {
				continue
			}
			if len(v.AsString()) > maxAttr {
				t.Errorf("limit %d: attribute %s of %d bytes", limit, k, len(v.AsString()))
			}
			total += len(v.AsString())
		}
		if tr, ok := lr.Attributes().Get(LogAttrStackTrace); !ok || !json.Valid([]byte(tr.Str())) {
			t.Errorf("limit %d: stackTrace missing or not JSON", limit)
		}
		t.Logf("limit %d: %d bytes of log attributes for 50 frames of a 500 KB name", limit, total)
	}
}

// A frames attribute larger than limits.max_frames_json_bytes is refused
// with limit_exceeded; frames beyond max_log_frames are ignored.
func TestLogLimits(t *testing.T) {
	bin := fixture(t, "otlpsym-logs")
	ids := idsOf(t, bin)
	hot := inside(t, bin, "hot")
	var lf []LogFrame
	for i := 0; i < 100; i++ {
		lf = append(lf, LogFrame{BuildID: ids.gnu, Address: hot, File: bin, FrameType: "native"})
	}
	frames, _ := json.Marshal(lf)
	opt := defaults()
	opt.Limits = Limits{MaxFramesJSON: len(frames) - 1, MaxLogFrames: 10}
	s := newSym(t, opt)
	ld := plog.NewLogs()
	recs := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	big := recs.AppendEmpty()
	big.Attributes().PutStr(LogAttrFrames, string(frames))
	small, _ := json.Marshal(lf[:20])
	ok := recs.AppendEmpty()
	ok.Attributes().PutStr(LogAttrFrames, string(small))
	st := s.Logs(context.Background(), ld)
	if v, _ := big.Attributes().Get(frame.AttrError); v.Str() != "limit_exceeded" {
		t.Errorf("oversized frames attribute: error %q", v.Str())
	}
	if d, _ := ok.Attributes().Get(LogAttrStackDepth); d.Int() != 10 || st.Resolved != 10 {
		t.Errorf("max_log_frames: depth %d, resolved %d", d.Int(), st.Resolved)
	}
}

// Native frames with no mapping, or whose mapping has no identity, say so.
func TestNoMapping(t *testing.T) {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	mi := d.Mapping(pdict.Mapping{Start: 0x1000, Limit: 0x2000, File: "[vdso]"})
	l1 := d.Location(pdict.Location{Address: 0x1234, Attrs: []int32{d.AttrStr(frame.AttrFrameType, frame.TypeNative)}})
	l2 := d.Location(pdict.Location{Mapping: mi, Address: 0x1500})
	s := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples().AppendEmpty()
	s.SetStackIndex(d.Stack([]int32{l1, l2}))
	s.Values().Append(7)
	st := newSym(t, defaults()).Profiles(context.Background(), pd)
	for _, l := range []int32{l1, l2} {
		if got := reasonOf(pd, l); got != "no_mapping" {
			t.Errorf("location %d: reason %q, want no_mapping (stats %+v)", l, got, st)
		}
	}
	checkSamples(t, pd)
}
