package hotspot_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestHostileProcess runs a program that links a libjvm.so of its own
// whose gHotSpotVM* tables are forged: cyclic, endless names, wild
// pointers (the agent must refuse the layout, counted and logged), or a
// layout that passes every check but claims the program's own code as a
// code cache with a segment map of garbage (the walker must give up on
// each frame, mark the stack runtime and leave it to the native walker).
// The program's stacks keep their native frames either way, and the
// agent neither hangs nor grows. In walker-late the tables stay as linked
// (pointers to nowhere, as before a loader relocates them) for a second,
// and a snapshot reads them then: that failure is retried, not final, and
// the JVM is walked once its tables are set.
func TestHostileProcess(t *testing.T) {
	h := newHarness(t, sampler.Config{Runtimes: runtimes.Config{HotSpot: true}})
	// The program forges its tables as it starts; a snapshot taken while
	// the loader ran saw the honest ones. A refusal of what the process's
	// memory holds takes attachTries failures a second apart or more: the
	// snapshots a process running in its JVM's code would bring (the
	// walker asks for them). A layout that passes needs one.
	bin, lib := forgedJVM(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, tc := range []struct {
		name, mode string
		walked     bool   // the layout passes: the walker runs and gives up, stop runtime
		delay      string // seconds before the program forges its tables
	}{
		{"cyclic", "cyclic", false, ""},
		{"endless", "endless", false, ""},
		{"wild", "wild", false, ""},
		{"walker", "walker", true, ""},
		{"walker-zero", "walker-zero", true, ""},
		{"walker-late", "walker", true, "0.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed := h.s.Runtimes().Stats().Failed["hotspot"]
			// A copy per mode: layouts are remembered per libjvm file
			// (its version: a fresh mtime, even where an inode is
			// reused).
			dir := t.TempDir()
			for _, f := range []string{bin, lib} {
				testfixture.Run(t, "cp", f, dir)
			}
			args := []string{tc.mode, "30"}
			// The window starts once the program has loaded its library
			// and set its tables ("ready"), then the snapshots: in the
			// emulated arm64 VM a fixed second and a half was not always
			// enough for the start and the dlopen.
			warm := warmup{d: 15 * time.Second, jit: watchLine("ready")}
			h.snapshotEarly = 0
			h.snapshotsAfterWarm = 3
			if tc.walked {
				h.snapshotsAfterWarm = 1
			}
			if tc.delay != "" {
				args = append(args, tc.delay)
				h.snapshotEarly = 300 * time.Millisecond // the tables not set yet
			}
			cmd := exec.Command(filepath.Join(dir, "hostile"), args...)
			cmd.Stderr = os.Stderr
			h.sampleJVMAfter(t, cmd, warm, 3*time.Second, 150, false, func(pid int, samples []sampler.Sample) {
				p, err := h.norm.Refresh(pid)
				if err != nil {
					t.Fatal(err)
				}
				var all, chain, runtimeStop uint64
				stops := map[string]uint64{}
				for _, s := range samples {
					all += s.Count
					stops[s.Stop.String()] += s.Count
					if s.Stop == sampler.StopRuntime {
						runtimeStop += s.Count
					}
					if len(s.Runtime) > 0 {
						t.Fatalf("a runtime frame in a forged JVM: %+v", s.Runtime)
					}
					if hasChain(t, p, filepath.Join(dir, "hostile"), s.UserPCs, "leaf", "spin_b", "spin_a", "main") {
						chain += s.Count
					}
				}
				t.Logf("%d samples, %d with leaf <- spin_b <- spin_a <- main; stops %v", all, chain, stops)
				if all < 20 {
					t.Fatalf("only %d samples", all)
				}
				if chain*100 < all*95 {
					t.Errorf("native frames kept in %d of %d samples", chain, all)
				}
				if tc.walked && runtimeStop*10 < all*9 {
					t.Errorf("stop reason runtime in %d of %d samples", runtimeStop, all)
				}
				if !tc.walked && runtimeStop > 0 {
					t.Errorf("stop reason runtime in %d samples of a process whose code is never handed to the walker", runtimeStop)
				}
			})
			if !tc.walked && h.s.Runtimes().Stats().Failed["hotspot"] == failed {
				t.Error("the forged layout was not counted as a failure")
			}
			if tc.walked && h.s.Runtimes().Stats().Failed["hotspot"] != failed {
				t.Error("a layout that passes was counted as a failure")
			}
		})
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("heap in use %d -> %d KB", before.HeapInuse>>10, after.HeapInuse>>10)
	if after.HeapInuse > before.HeapInuse+32<<20 {
		t.Errorf("heap grew from %d to %d bytes", before.HeapInuse, after.HeapInuse)
	}
}

// hasChain reports whether pcs hold the functions of bin in this order,
// innermost first, as consecutive frames.
func hasChain(t *testing.T, p *normalize.Process, bin string, pcs []uint64, fns ...string) bool {
	for i := range pcs {
		ok := true
		for k, fn := range fns {
			if i+k >= len(pcs) || pcs[i+k]&sampler.RuntimeMark != 0 {
				ok = false
				break
			}
			if !inFunc(t, p, bin, fn, pcs[i+k]) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// The forging program and its libjvm.so, whose tables are generated from
// what JDK 17's say (testdata/jdk17.tables) into hostile-libjvm.c, checked
// in so that a fixture's sources are files (testfixture.Build, which
// test/kernels' prebuilt fixtures need); TestForgedLibraryCurrent holds
// the file to the generator.
var (
	forgedLib  = testfixture.Spec{Name: "libjvm.so", Lang: "c", Sources: []string{"runtimes/java/hostile-libjvm.c"}, Args: []string{"-O1", "-shared", "-fPIC"}}
	forgedMain = testfixture.Spec{Name: "hostile", Lang: "c", Sources: []string{"runtimes/java/hostile.c"}, Args: []string{"-O2"}}
)

// forgedJVM builds the hostile program and its libjvm.so and returns both
// paths; the program opens the library in its own directory.
func forgedJVM(t *testing.T) (bin, lib string) {
	t.Helper()
	return testfixture.Build(t, forgedMain), testfixture.Build(t, forgedLib)
}

// TestFixturesBuild builds the package's native fixtures: test/kernels
// runs it to export them, built for the VM's architecture
// (testfixture.EnvExport), into the image.
func TestFixturesBuild(t *testing.T) {
	for _, s := range []testfixture.Spec{forgedLib, forgedMain} {
		t.Run(s.Name, func(t *testing.T) { testfixture.Build(t, s) })
	}
}

// TestForgedLibraryCurrent: hostile-libjvm.c is what forgedLibrary
// generates (PROFSYM_UPDATE_FORGED=1 rewrites it).
func TestForgedLibraryCurrent(t *testing.T) {
	path := testfixture.Src(t, "runtimes/java/hostile-libjvm.c")
	want := forgedLibrary(t)
	if os.Getenv("PROFSYM_UPDATE_FORGED") != "" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is not what testdata/jdk17.tables generates: PROFSYM_UPDATE_FORGED=1 go test -run TestForgedLibraryCurrent ./internal/host/runtimes/hotspot", path)
	}
}

// forgedLibrary writes the C source of the forged libjvm.so.
func forgedLibrary(t *testing.T) []byte {
	t.Helper()
	f, err := os.Open("testdata/jdk17.tables")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var structs, types, ints []string
	statics := map[string]int{}
	offsets := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		switch w[0] {
		case "F":
			i := strings.LastIndex(w[1], "::")
			typ, name := w[1][:i], w[1][i+2:]
			if w[2] == "static" {
				statics[w[1]] = len(statics)
				structs = append(structs, fmt.Sprintf("{%q, %q, 0, 1, 0, &statics[%d]}", typ, name, statics[w[1]]))
			} else {
				structs = append(structs, fmt.Sprintf("{%q, %q, 0, 0, %s, 0}", typ, name, w[2]))
				offsets[w[1]] = w[2]
			}
		case "T":
			types = append(types, fmt.Sprintf("{%q, 0, 0, 0, 0, %s}", w[1], w[2]))
		case "I":
			ints = append(ints, fmt.Sprintf("{%q, %s}", w[1], w[2]))
		}
	}
	sort.Strings(structs)
	var b strings.Builder
	fmt.Fprintf(&b, `/* Generated by internal/host/runtimes/hotspot's forgedLibrary
 * (TestForgedLibraryCurrent): HotSpot's tables as JDK 17 has them, and
 * forge(), which breaks or fakes them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct vs { const char *type, *field, *typestr; int32_t is_static; uint64_t offset; void *address; };
struct vt { const char *type, *super; int32_t oop, integer, unsig; uint64_t size; };
struct vc { const char *name; int32_t value; };
struct vl { const char *name; uint64_t value; };

static uint64_t statics[%d];
static struct vs structs[] = {
	%s,
	{0}};
static struct vt types[] = {
	%s,
	{0}};
static struct vc ints[] = {
	%s,
	{0}};
static struct vl longs[] = {{0}};
`, len(statics), strings.Join(structs, ",\n\t"), strings.Join(types, ",\n\t"), strings.Join(ints, ",\n\t"))
	b.WriteString(`
struct vs *gHotSpotVMStructs = structs;
uint64_t gHotSpotVMStructEntryArrayStride = sizeof(struct vs);
uint64_t gHotSpotVMStructEntryTypeNameOffset = offsetof(struct vs, type);
uint64_t gHotSpotVMStructEntryFieldNameOffset = offsetof(struct vs, field);
uint64_t gHotSpotVMStructEntryIsStaticOffset = offsetof(struct vs, is_static);
uint64_t gHotSpotVMStructEntryOffsetOffset = offsetof(struct vs, offset);
uint64_t gHotSpotVMStructEntryAddressOffset = offsetof(struct vs, address);
struct vt *gHotSpotVMTypes = types;
uint64_t gHotSpotVMTypeEntryArrayStride = sizeof(struct vt);
uint64_t gHotSpotVMTypeEntryTypeNameOffset = offsetof(struct vt, type);
uint64_t gHotSpotVMTypeEntrySizeOffset = offsetof(struct vt, size);
struct vc *gHotSpotVMIntConstants = ints;
uint64_t gHotSpotVMIntConstantEntryArrayStride = sizeof(struct vc);
uint64_t gHotSpotVMIntConstantEntryNameOffset = offsetof(struct vc, name);
uint64_t gHotSpotVMIntConstantEntryValueOffset = offsetof(struct vc, value);
struct vl *gHotSpotVMLongConstants = longs;
uint64_t gHotSpotVMLongConstantEntryArrayStride = sizeof(struct vl);
uint64_t gHotSpotVMLongConstantEntryNameOffset = offsetof(struct vl, name);
uint64_t gHotSpotVMLongConstantEntryValueOffset = offsetof(struct vl, value);

static char endless[1 << 20];
static uint8_t heap[4096], growable[64], queue[64];
static uint64_t heaps[1];

#define PUT64(buf, off, v) (*(uint64_t *)((uint8_t *)(buf) + (off)) = (uint64_t)(v))
#define PUT32(buf, off, v) (*(uint32_t *)((uint8_t *)(buf) + (off)) = (uint32_t)(v))
/* The JVM's major version, set last (a release store): until then the
 * tables read as no JDK at all, a failure the agent retries. Set first, a
 * snapshot in the middle of forge read the honest tables, whose layout is
 * then the file's for good, and the mode's forgery was never read (the
 * arm64 VM: wild, once, not refused). */
#define PUBLISH() __atomic_store_n((uint32_t *)&statics[VERSION_SLOT], 17, __ATOMIC_RELEASE)

void forge(const char *mode, uintptr_t lo, uintptr_t hi)
{
	size_t segs = (hi - lo) >> 6;
	uint8_t *segmap;

	if (!strcmp(mode, "cyclic")) {
		/* The table pointer points at itself, every type names itself. */
		gHotSpotVMStructs = (struct vs *)&gHotSpotVMStructs;
		for (struct vt *t = types; t->type; t++)
			t->type = (const char *)t;
		PUBLISH();
		return;
	}
	if (!strcmp(mode, "endless")) {
		memset(endless, 'A', sizeof(endless));
		for (struct vs *s = structs; s->type; s++)
			s->type = endless;
		PUBLISH();
		return;
	}
	if (!strcmp(mode, "wild")) {
		gHotSpotVMTypes = (struct vt *)0x10000;
		for (struct vs *s = structs; s->type; s++)
			s->offset = (uint64_t)-8;
		PUBLISH();
		return;
	}
	/* walker, walker-zero: a JVM that passes every check, whose code
	 * cache is this program's code and whose segment map is garbage. */
	segmap = malloc(segs + 1);
	memset(segmap, strcmp(mode, "walker-zero") ? 1 : 0, segs + 1);
`)
	put := func(format, key string, args ...any) {
		fmt.Fprintf(&b, "\t"+format+"\n", append([]any{offsets[key]}, args...)...)
	}
	fmt.Fprintf(&b, "\tstatics[%d] = lo;\n\tstatics[%d] = hi;\n", statics["CodeCache::_low_bound"], statics["CodeCache::_high_bound"])
	fmt.Fprintf(&b, "\tstatics[%d] = (uint64_t)growable;\n", statics["CodeCache::_heaps"])
	put("PUT32(growable, %s, 1);", "GrowableArrayBase::_len")
	put("PUT64(growable, %s, heaps);", "GrowableArray<int>::_data")
	b.WriteString("\theaps[0] = (uint64_t)heap;\n")
	fmt.Fprintf(&b, "\tPUT64(heap, %s + %s, lo);\n", offsets["CodeHeap::_memory"], offsets["VirtualSpace::_low_boundary"])
	fmt.Fprintf(&b, "\tPUT64(heap, %s + %s, hi);\n", offsets["CodeHeap::_memory"], offsets["VirtualSpace::_high_boundary"])
	fmt.Fprintf(&b, "\tPUT64(heap, %s + %s, segmap);\n", offsets["CodeHeap::_segmap"], offsets["VirtualSpace::_low_boundary"])
	put("PUT32(heap, %s, 6);", "CodeHeap::_log2_segment_size")
	fmt.Fprintf(&b, "\tstatics[%d] = (uint64_t)queue;\n", statics["AbstractInterpreter::_code"])
	put("PUT64(queue, %s, lo);", "StubQueue::_stub_buffer")
	put("PUT32(queue, %s, 16);", "StubQueue::_buffer_limit")
	fmt.Fprintf(&b, "\tstatics[%d] = lo + 8;\n\tPUBLISH();\n}\n", statics["StubRoutines::_call_stub_return_address"])
	return []byte(strings.ReplaceAll(b.String(), "VERSION_SLOT", strconv.Itoa(statics["Abstract_VM_Version::_vm_major_version"])))
}
