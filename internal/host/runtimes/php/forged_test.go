package php_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// harness runs the sampler with the PHP walker and builds reports the way
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
	s, err := sampler.New(sampler.Config{SampleRate: 99, Logger: log, Runtimes: runtimes.Config{PHP: true}})
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

// phpFrame is one PHP frame of a sample.
type phpFrame struct {
	name, file, err string
	line            int
}

// sampleView is a sample of a report, leaf first.
type sampleView struct {
	count  int64
	stop   string
	php    []phpFrame
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
						case pframe.TypePHP:
							p := phpFrameOf(dict, str, l)
							p.err, _ = a[pframe.AttrError].(string)
							sv.php = append(sv.php, p)
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

func phpFrameOf(dict pprofile.ProfilesDictionary, str func(int32) string, l pprofile.Location) phpFrame {
	if l.Lines().Len() == 0 {
		return phpFrame{name: "?"}
	}
	ln := l.Lines().At(0)
	fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
	return phpFrame{name: str(fn.NameStrindex()), file: str(fn.FilenameStrindex()), line: int(ln.Line())}
}

// walkerStats reads the newest php_stats map's counters.
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
		if info, err := m.Info(); err == nil && info.Name == "php_stats" {
			if newest != nil {
				newest.Close()
			}
			newest = m
			continue
		}
		m.Close()
	}
	if newest == nil {
		return "no php_stats map"
	}
	defer newest.Close()
	var per []bpf.ProfilePhpCounters
	if err := newest.Lookup(uint32(0), &per); err != nil {
		return err.Error()
	}
	var sum bpf.ProfilePhpCounters
	for _, p := range per {
		sum.Walks += p.Walks
		sum.Frames += p.Frames
		for i := range sum.Errors {
			sum.Errors[i] += p.Errors[i]
		}
	}
	return fmt.Sprintf("%+v", sum)
}

// TestForgedPHP runs processes that forge PHP's state (forged.c, installed
// as php8.2): a version without a layout, a thread-safe build, chains that
// turn into loops, a wild pointer, or 4096 frames with no end flag and a
// freed function after attach, with endless names. Each keeps its native
// frames and says runtime; names stay within max_name_length; the agent
// carries on.
func TestForgedPHP(t *testing.T) {
	install := func(name string, args ...string) string {
		bin := testfixture.Build(t, testfixture.Spec{
			Name: name, Lang: "c", Sources: []string{"runtimes/php/forged.c"},
			Args: append([]string{"-O1", "-g", "-fno-omit-frame-pointer"}, args...),
		})
		php := filepath.Join(t.TempDir(), "php8.2")
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(php, b, 0o755); err != nil {
			t.Fatal(err)
		}
		return php
	}
	bins := map[string]string{"version": install("forged-php-83", `-DVERSION="8.3.0"`), "zts": install("forged-php-zts", "-DZTS")}
	plain := install("forged-php")
	h := newHarness(t)
	for _, mode := range []string{"version", "zts", "late-loop", "deep-loop", "wild", "no-top"} {
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
			h.collect(t)
			// The forgery turns hostile 1 s after the start; what is
			// measured is from 1.5 s to 4 s.
			time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
			h.collect(t)
			time.Sleep(2500 * time.Millisecond)
			pid := cmd.Process.Pid
			r := h.collect(t)
			var total, runtime, named int64
			for _, s := range samplesOf(t, r, pid) {
				total += s.count
				if s.stop == "runtime" {
					runtime += s.count
				}
				if s.native < 2 {
					t.Errorf("a sample with %d native frames: %+v", s.native, s)
				}
				for _, p := range s.php {
					if p.err == "" {
						named += s.count
					}
					if len(p.name) > runtimes.DefaultMaxNameBytes || len(p.file) > runtimes.DefaultMaxNameBytes {
						t.Errorf("a name of %d bytes, file of %d", len(p.name), len(p.file))
					}
				}
			}
			t.Logf("pid %d (%v): %d samples, %d say runtime, %d named php frames; set %+v; walker %s; failures %v",
				pid, time.Since(start).Round(time.Millisecond), total, runtime, named, h.s.Runtimes().Stats(), walkerStats(), r.Failures)
			if total < 20 {
				t.Fatalf("only %d samples", total)
			}
			if float64(runtime) < 0.95*float64(total) {
				t.Errorf("%d/%d samples say runtime, want >= 95%%", runtime, total)
			}
			if refused && named > 0 {
				t.Errorf("%d php frames from a process refused at attach", named)
			}
		})
	}
}
