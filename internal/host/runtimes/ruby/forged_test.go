package ruby_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/bpf"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// harness runs the sampler with the Ruby walker and builds reports the way
// the profiling receiver does.
type harness struct {
	s     *sampler.Sampler
	b     *profbuild.Builder
	start time.Time
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	s, err := sampler.New(sampler.Config{SampleRate: 99, Logger: log, Runtimes: runtimes.Config{Ruby: true}})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, start: time.Now()}
	h.b = profbuild.New(profbuild.Options{SampleRate: 99, Unwinder: s.Unwinder(), Runtimes: s.Runtimes()})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range s.Events() {
			h.b.HandleEvent(ev)
		}
	}()
	t.Cleanup(func() { s.Close(); <-done })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) collect(t testing.TB) profbuild.Report {
	t.Helper()
	r, err := h.b.Collect(h.s, h.start)
	if err != nil {
		t.Fatal(err)
	}
	h.start = time.Now()
	return r
}

// rubyFrame is one Ruby frame of a sample.
type rubyFrame struct {
	name, file, err string
	line            int
}

// sampleView is a sample of a report, leaf first.
type sampleView struct {
	count  int64
	stop   string
	ruby   []rubyFrame
	native int
}

func samplesOf(t testing.TB, r profbuild.Report, pid int) []sampleView {
	t.Helper()
	dict := r.Profiles.Dictionary()
	str := func(i int32) string { return dict.StringTable().At(int(i)) }
	attrs := func(idx []int32) map[string]any {
		out := map[string]any{}
		for _, i := range idx {
			kv := dict.AttributeTable().At(int(i))
			out[str(kv.KeyStrindex())] = kv.Value().AsRaw()
		}
		return out
	}
	var out []sampleView
	for _, rp := range r.Profiles.ResourceProfiles().All() {
		if p, _ := rp.Resource().Attributes().Get(pframe.AttrPID); p.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					sv := sampleView{count: s.Values().At(0)}
					sv.stop, _ = attrs(s.AttributeIndices().AsRaw())[pframe.AttrUnwindStop].(string)
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						l := dict.LocationTable().At(int(li))
						a := attrs(l.AttributeIndices().AsRaw())
						switch a[pframe.AttrFrameType] {
						case pframe.TypeRuby:
							p := rubyFrameOf(dict, str, l)
							p.err, _ = a[pframe.AttrError].(string)
							sv.ruby = append(sv.ruby, p)
						case pframe.TypeKernel:
						default:
							sv.native++
						}
					}
					out = append(out, sv)
				}
			}
		}
	}
	return out
}

func rubyFrameOf(dict pprofile.ProfilesDictionary, str func(int32) string, l pprofile.Location) rubyFrame {
	if l.Lines().Len() == 0 {
		return rubyFrame{name: "?"}
	}
	ln := l.Lines().At(0)
	fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
	return rubyFrame{name: str(fn.NameStrindex()), file: str(fn.FilenameStrindex()), line: int(ln.Line())}
}

// walkerStats reads the newest ruby_stats map's counters.
func walkerStats() string {
	var newest *ebpf.Map
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if err != nil {
			break
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		if info, err := m.Info(); err == nil && info.Name == "ruby_stats" {
			if newest != nil {
				newest.Close()
			}
			newest = m
			continue
		}
		m.Close()
	}
	if newest == nil {
		return "no ruby_stats map"
	}
	defer newest.Close()
	var per []bpf.ProfileRubyCounters
	if err := newest.Lookup(uint32(0), &per); err != nil {
		return err.Error()
	}
	var sum bpf.ProfileRubyCounters
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return fmt.Sprintf("%+v", sum)
}

// TestForgedRuby runs processes that forge Ruby's state (forged.c as
// libruby-3.1.so.3.1.99, linked into forged_main.c): a version without a
// layout, an execution context whose cfp turns wild, 48 control frames
// with no FINISH flag up to the stack's end, and iseqs freed after attach,
// with endless labels, and an iseq's slot taken by another. Each keeps its
// native frames; the first three say runtime; names stay within
// max_name_length; freed iseqs stay unnamed, and a slot's new iseq is
// named as itself, not from the cache; the agent carries on.
func TestForgedRuby(t *testing.T) {
	install := func(variant string, args ...string) string {
		lib := testfixture.Build(t, testfixture.Spec{
			Name: "libruby-forged-" + variant + ".so", Lang: "c", Sources: []string{"runtimes/ruby/forged.c"},
			Args: append([]string{"-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC"}, args...),
		})
		dir := filepath.Join(testfixture.CacheDir(), "ruby-forged", variant)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "libruby-3.1.so.3.1.99"), b, 0o755); err != nil {
			t.Fatal(err)
		}
		return testfixture.Build(t, testfixture.Spec{
			Name: "ruby-forged-" + variant, Lang: "c", Sources: []string{"runtimes/ruby/forged_main.c"},
			Args: []string{"-O1", "-g", "-fno-omit-frame-pointer", "-L" + dir, "-Wl,--no-as-needed", "-l:libruby-3.1.so.3.1.99", "-Wl,-rpath," + dir},
		})
	}
	testfixture.Short(t, "eBPF")
	bins := map[string]string{"version": install("32", `-DVERSION="3.2.99"`)}
	plain := install("31")
	h := newHarness(t)
	for _, mode := range []string{"version", "wild", "no-finish", "freed", "reused"} {
		t.Run(mode, func(t *testing.T) {
			bin, refused := bins[mode]
			if !refused {
				bin = plain
			}
			cmd := exec.Command(bin, mode)
			cmd.Stderr = os.Stderr
			verdicts := func() uint64 {
				st := h.s.Runtimes().Stats()
				n := st.Attached
				for _, f := range st.Failed {
					n += f
				}
				return n
			}
			before := verdicts()
			start := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			for deadline := time.Now().Add(15 * time.Second); verdicts() == before; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no verdict on pid %d after 15 s: %+v", cmd.Process.Pid, h.s.Runtimes().Stats())
				}
			}
			pid := cmd.Process.Pid
			h.collect(t)
			if mode == "freed" || mode == "reused" {
				// Its frames are named first (their names cached), then
				// the iseq is freed: from then on no frame may be named,
				// cache or not (freed), or named as the old iseq
				// (reused). What is measured starts 0.5 s later.
				named := 0
				for deadline := time.Now().Add(10 * time.Second); named == 0; time.Sleep(100 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("no ruby frame of the forgery named in 10 s, before its iseq was freed")
					}
					for _, s := range samplesOf(t, h.collect(t), pid) {
						for _, p := range s.ruby {
							if p.err == "" {
								named++
							}
						}
					}
				}
				if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Millisecond)
				start = time.Now()
			} else {
				// The forgery turns hostile 1 s after the start; what is
				// measured is from 1.5 s to 4 s.
				time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
			}
			h.collect(t)
			time.Sleep(2500 * time.Millisecond)
			r := h.collect(t)
			var total, runtime, named, frames, reused int64
			for _, s := range samplesOf(t, r, pid) {
				total += s.count
				if s.stop == "runtime" {
					runtime += s.count
				}
				if s.native < 2 {
					t.Errorf("a sample with %d native frames: %+v", s.native, s)
				}
				for _, p := range s.ruby {
					frames += s.count
					if p.err == "" {
						named += s.count
					}
					if p.name == "reused" {
						reused += s.count
					}
					if len(p.name) > runtimes.DefaultMaxNameBytes || len(p.file) > runtimes.DefaultMaxNameBytes {
						t.Errorf("a name of %d bytes, file of %d", len(p.name), len(p.file))
					}
				}
			}
			t.Logf("pid %d (%v): %d samples, %d say runtime, %d of %d ruby frames named; set %+v; walker %s; failures %v",
				pid, time.Since(start).Round(time.Millisecond), total, runtime, named, frames, h.s.Runtimes().Stats(), walkerStats(), r.Failures)
			if total < 20 {
				t.Fatalf("only %d samples", total)
			}
			switch mode {
			case "reused":
				if frames == 0 || reused != frames {
					t.Errorf("%d of %d ruby frames named as the iseq now in the slot, want all of some", reused, frames)
				}
			case "freed":
				if frames == 0 || named > 0 {
					t.Errorf("%d of %d ruby frames named after their iseq was freed, want none of some", named, frames)
				}
			default:
				if float64(runtime) < 0.95*float64(total) {
					t.Errorf("%d/%d samples say runtime, want >= 95%%", runtime, total)
				}
			}
			if refused && named > 0 {
				t.Errorf("%d ruby frames from a process refused at attach", named)
			}
		})
	}
}
