package perl_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/profsym/profsym/bpf"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// harness runs the sampler with the Perl walker and builds reports the
// way the profiling receiver does.
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
	s, err := sampler.New(sampler.Config{SampleRate: 99, Logger: log, Runtimes: runtimes.Config{Perl: true}})
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

// perlFrame is one Perl frame of a sample.
type perlFrame struct{ name, file, err string }

// sampleView is a sample of a report, leaf first.
type sampleView struct {
	count  int64
	stop   string
	perl   []perlFrame
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
						case pframe.TypePerl:
							var f perlFrame
							f.err, _ = a[pframe.AttrError].(string)
							if l.Lines().Len() > 0 {
								fn := dict.FunctionTable().At(int(l.Lines().At(0).FunctionIndex()))
								f.name, f.file = str(fn.NameStrindex()), str(fn.FilenameStrindex())
							}
							sv.perl = append(sv.perl, f)
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

// walkerStats reads the newest perl_stats map, summed over CPUs.
func walkerStats(_ *testing.T) string {
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
		if info, err := m.Info(); err == nil && info.Name == "perl_stats" {
			if newest != nil {
				newest.Close()
			}
			newest = m
			continue
		}
		m.Close()
	}
	if newest == nil {
		return "no perl_stats map"
	}
	defer newest.Close()
	var per []bpf.ProfilePerlCounters
	if err := newest.Lookup(uint32(0), &per); err != nil {
		return err.Error()
	}
	var sum bpf.ProfilePerlCounters
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return fmt.Sprintf("%+v", sum)
}

// TestForgedInterpreter runs processes that forge Perl's state
// (testdata/src/runtimes/perl/forged.c, installed as perl): a forged
// version, and after attach a wild context stack, a context that is its
// own outer sub, a CV that is no CV, endless names and a CV freed after
// it was named. Each keeps its native frames and says runtime once forged
// (names stay within max_name_length before); the agent carries on.
func TestForgedInterpreter(t *testing.T) {
	install := func(name string, args ...string) string {
		bin := testfixture.Build(t, testfixture.Spec{
			Name: name, Lang: "c", Sources: []string{"runtimes/perl/forged.c"},
			Args: append([]string{"-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-rdynamic"}, args...),
		})
		pl := filepath.Join(t.TempDir(), "perl")
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pl, b, 0o755); err != nil {
			t.Fatal(err)
		}
		return pl
	}
	pl := install("forged-perl")
	pl599 := install("forged-perl-599", "-DMINOR=99")
	h := newHarness(t)
	for _, mode := range []string{"version", "wild", "loop", "notcv", "names"} {
		t.Run(mode, func(t *testing.T) {
			bin := pl
			if mode == "version" {
				bin = pl599
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
			// The forgery starts a second after the process; names' CV is
			// freed two seconds later.
			settle := 1500 * time.Millisecond
			if mode == "names" {
				time.Sleep(settle)
				r := h.collect(t)
				var named int64
				for _, s := range samplesOf(t, r, pid) {
					for _, p := range s.perl {
						if p.err == "" {
							named += s.count
						}
						if len(p.name) > runtimes.DefaultMaxNameBytes || len(p.file) > runtimes.DefaultMaxNameBytes {
							t.Errorf("a name of %d bytes, file of %d", len(p.name), len(p.file))
						}
					}
				}
				if named == 0 {
					t.Errorf("no named Perl frame while the sub was alive")
				}
				settle = 2 * time.Second
			}
			time.Sleep(settle)
			h.collect(t)
			time.Sleep(3 * time.Second)
			r := h.collect(t)
			var total, runtime, frames int64
			for _, s := range samplesOf(t, r, pid) {
				total += s.count
				if s.stop == "runtime" {
					runtime += s.count
				}
				if s.native < 2 {
					t.Errorf("a sample with %d native frames: %+v", s.native, s)
				}
				frames += int64(len(s.perl)) * s.count
			}
			t.Logf("pid %d: %d samples, %d say runtime, %d perl frames; set %+v; walker %s; failures %v",
				pid, total, runtime, frames, h.s.Runtimes().Stats(), walkerStats(t), r.Failures)
			if total < 20 {
				t.Fatalf("only %d samples", total)
			}
			if float64(runtime) < 0.95*float64(total) {
				t.Errorf("%d/%d samples say runtime, want >= 95%%", runtime, total)
			}
			if frames > 0 {
				t.Errorf("%d perl frames from a forged interpreter", frames)
			}
		})
	}
}
