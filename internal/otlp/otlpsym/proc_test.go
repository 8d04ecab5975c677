//go:build linux

package otlpsym

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/testfixture"
)

// liveProcess starts a copy of the sleeper fixture, waits until it runs,
// and deletes its file: only the process still reaches it.
func liveProcess(t *testing.T) (pid int, exe string, bin string) {
	t.Helper()
	built := testfixture.Build(t, testfixture.Spec{Name: "proc-sleeper", Lang: "c", Sources: []string{"elf/sleeper.c"},
		Args: []string{"-O2", "-g", "-Wl,--build-id"}})
	keep := filepath.Join(t.TempDir(), "sleeper-ref") // for the test's own address math
	copyTo(t, built, keep)
	exe = filepath.Join(t.TempDir(), "sleeper")
	copyTo(t, built, exe)
	cmd := exec.Command(exe)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stdout)
	if err := os.Remove(exe); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, exe, keep
}

// upstreamMapping is what opentelemetry-ebpf-profiler's reporter
// (reporter/internal/pdata/generate.go with processmanager's FrameMapping)
// writes for an executable mapping: the file's base name, memory_start and
// memory_limit in ELF space (the virtual address of the mapped file offset,
// plus the mapping's length), the file offset, and the file's GNU build id,
// Go build id and htlhash.
type upstreamMapping struct {
	start, limit, offset uint64
	base                 string
	id                   frame.Identity
	loads                []elfx.Segment
}

func upstreamMappings(t *testing.T, pid int, files map[string]string) map[string]upstreamMapping {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]upstreamMapping{}
	addrmap.ParseMaps(f, func(m addrmap.Mapping) error {
		ref, ok := files[filepath.Base(m.Path)]
		if !ok || m.Perms&addrmap.Exec == 0 {
			return nil
		}
		ef, err := elfx.Open(ref)
		if err != nil {
			t.Fatal(err)
		}
		defer ef.Close()
		elfVA, ok := addrmap.FileOffsetToVaddr(ef.Loads(), m.Offset)
		if !ok {
			t.Fatalf("%s: offset %#x in no PT_LOAD", ref, m.Offset)
		}
		out[filepath.Base(m.Path)] = upstreamMapping{start: elfVA, limit: elfVA + (m.End - m.Start), offset: m.Offset,
			base: filepath.Base(m.Path), id: buildid.Identify(ef), loads: ef.Loads()}
		return nil
	})
	return out
}

// upstreamProfile writes one sample per frame in the upstream reporter's
// shape: resource process.pid and process.executable.path/name; native
// locations whose address is the ELF virtual address; sample attributes
// thread.name, thread.id, cpu.logical_number.
func upstreamProfile(pid int, exe string, frames []struct {
	m    upstreamMapping
	addr uint64
}) (pprofile.Profiles, []int32) {
	pd := pprofile.NewProfiles()
	d := pdict.New(pd.Dictionary())
	rp := pd.ResourceProfiles().AppendEmpty()
	rp.SetSchemaUrl("https://opentelemetry.io/schemas/1.37.0")
	a := rp.Resource().Attributes()
	a.PutInt(frame.AttrPID, int64(pid))
	a.PutStr(frame.AttrExePath, exe)
	a.PutStr(frame.AttrExeName, filepath.Base(exe))
	sp := rp.ScopeProfiles().AppendEmpty()
	sp.Scope().SetName("go.opentelemetry.io/ebpf-profiler")
	p := sp.Profiles().AppendEmpty()
	p.SampleType().SetTypeStrindex(d.String("samples"))
	p.SampleType().SetUnitStrindex(d.String("count"))
	p.PeriodType().SetTypeStrindex(d.String("cpu"))
	p.PeriodType().SetUnitStrindex(d.String("nanoseconds"))
	p.SetPeriod(1e9 / 20)
	var locs []int32
	for _, f := range frames {
		var attrs []int32
		if f.m.id.GNU != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDGNU, f.m.id.GNU))
		}
		if f.m.id.Go != "" {
			attrs = append(attrs, d.AttrStr(frame.AttrBuildIDGo, f.m.id.Go))
		}
		attrs = append(attrs, d.AttrStr(frame.AttrBuildIDHTL, f.m.id.HTL))
		mi := d.Mapping(pdict.Mapping{Start: f.m.start, Limit: f.m.limit, Offset: f.m.offset, File: f.m.base, Attrs: attrs})
		locs = append(locs, d.Location(pdict.Location{Mapping: mi, Address: f.addr,
			Attrs: []int32{d.AttrStr(frame.AttrFrameType, frame.TypeNative)}}))
	}
	s := p.Samples().AppendEmpty()
	s.SetStackIndex(d.Stack(locs))
	s.Values().Append(7)
	s.TimestampsUnixNano().Append(uint64(pcommon.NewTimestampFromTime(time.Now())))
	s.AttributeIndices().Append(d.AttrStr(frame.AttrThreadName, "sleeper"), d.AttrInt(frame.AttrThreadID, int64(pid)),
		d.AttrInt(frame.AttrCPU, 0))
	return pd, locs
}

// The upstream profiler's native frames of a live process are named by the
// proc source: base-name mappings matched by file offset in
// /proc/PID/maps, the (deleted) executable read through map_files, libc
// with its libc6-dbg debug file. With the local source alone, as before,
// they end no_debug_info (77,677 of 98,457 frames in the run).
func TestProcUpstreamShape(t *testing.T) {
	pid, exe, ref := liveProcess(t)
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	ms := upstreamMappings(t, pid, map[string]string{"sleeper": ref, "libc.so.6": libc})
	if len(ms) != 2 {
		t.Fatalf("mappings found: %v", ms)
	}
	target := inside(t, ref, "profsym_target")
	readStart := dynsym(t, libc, "read")
	frames := []struct {
		m    upstreamMapping
		addr uint64
	}{{ms["sleeper"], target}, {ms["libc.so.6"], readStart + 4}, {ms["sleeper"], inside(t, ref, "main")}}

	for _, tc := range []struct {
		name  string
		order []string
		named bool
	}{
		{"local only (before)", []string{locate.SourceLocal, locate.SourceDebugDirs}, false},
		{"proc", []string{locate.SourceProc, locate.SourceLocal, locate.SourceDebugDirs}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd, locs := upstreamProfile(pid, exe, frames)
			opt := defaults()
			opt.Locate = locate.Config{Order: tc.order, DebugDirs: []string{"/usr/lib/debug"}}
			s := newSym(t, opt)
			st := s.Profiles(context.Background(), pd)
			t.Logf("stats %+v", st)
			got := names(pd, locs[0])
			if !tc.named {
				if len(got) > 0 || reasonOf(pd, locs[0]) != "no_debug_info" {
					t.Errorf("without proc: %v %q", got, reasonOf(pd, locs[0]))
				}
				return
			}
			if len(got) == 0 || got[len(got)-1] != "profsym_target" {
				t.Fatalf("executable frame: %v (reason %q)", got, reasonOf(pd, locs[0]))
			}
			l := pd.Dictionary().LocationTable().At(int(locs[0])).Lines().At(0)
			fn := pd.Dictionary().FunctionTable().At(int(l.FunctionIndex()))
			if l.Line() == 0 || !strings.HasSuffix(pd.Dictionary().StringTable().At(int(fn.FilenameStrindex())), "sleeper.c") {
				t.Errorf("executable frame without file and line: line %d", l.Line())
			}
			if got := names(pd, locs[1]); len(got) == 0 || !strings.Contains(got[len(got)-1], "read") {
				t.Errorf("libc frame: %v (reason %q)", got, reasonOf(pd, locs[1]))
			}
			if got := names(pd, locs[2]); len(got) == 0 || got[len(got)-1] != "main" {
				t.Errorf("main: %v", got)
			}
			checkSamples(t, pd)
		})
	}

	// A reused or foreign pid never names a frame: the file the process has
	// under that base name carries another identity.
	wrong := ms["sleeper"]
	wrong.id = frame.Identity{GNU: "0123456789abcdef0123456789abcdef01234567", HTL: "00112233445566778899aabbccddeeff"}
	pd, locs := upstreamProfile(pid, exe, []struct {
		m    upstreamMapping
		addr uint64
	}{{wrong, target}})
	opt := defaults()
	opt.Locate = locate.Config{Order: []string{locate.SourceProc}}
	newSym(t, opt).Profiles(context.Background(), pd)
	if got := names(pd, locs[0]); len(got) > 0 || reasonOf(pd, locs[0]) != "build_id_mismatch" {
		t.Errorf("foreign identity: %v %q", got, reasonOf(pd, locs[0]))
	}
}

func dynsym(t *testing.T, path, name string) uint64 {
	f, err := elf.Open(path)
	if err != nil {
		testfixture.SkipOrFail(t, "%s: %v", path, err)
	}
	defer f.Close()
	syms, _ := f.DynamicSymbols()
	for _, s := range syms {
		if s.Name == name && s.Value != 0 {
			return s.Value
		}
	}
	t.Fatalf("%s has no %s", path, name)
	return 0
}
