package profilingreceiver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadatatest"
)

// typedTotals sums the values of each profile type (sample type name) by pid.
func typedTotals(pds []pprofile.Profiles) map[string]map[int64]int64 {
	out := map[string]map[int64]int64{}
	for _, pd := range pds {
		st := pd.Dictionary().StringTable()
		for _, rp := range pd.ResourceProfiles().All() {
			pid, _ := rp.Resource().Attributes().Get(pframe.AttrPID)
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					typ := st.At(int(p.SampleType().TypeStrindex()))
					if out[typ] == nil {
						out[typ] = map[int64]int64{}
					}
					for _, s := range p.Samples().All() {
						out[typ][pid.Int()] += s.Values().At(0)
					}
				}
			}
		}
	}
	return out
}

// TestOffCPUEndToEnd: the receiver with off_cpu on, limited to one
// process, through the collector API: that process's off_cpu and wall
// profiles arrive with the time it slept, no other process has one, the
// waits are counted, and nothing is left open.
func TestOffCPUEndToEnd(t *testing.T) {
	needSampler(t)
	built := testfixture.Build(t, testfixture.Spec{
		Name: "offcpu-wait", Lang: "c", Sources: []string{"offcpu/wait.c"},
		Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-pthread"},
	})
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("rcv%08x", rand.Uint32())
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tt := componenttest.NewTelemetry()
	defer tt.Shutdown(ctx)
	fds := countFDs(t)

	f := NewFactory()
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.ReportInterval = time.Second
	cfg.OffCPU.Enabled, cfg.OffCPU.Wall = true, true
	cfg.OffCPU.Targets = []TargetConfig{{ProcessName: "^" + name + "$"}}
	ps := new(consumertest.ProfilesSink)
	pr, err := f.CreateProfiles(ctx, metadatatest.NewSettings(tt), cfg, ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := pr.Start(ctx, componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "sleep", "2")
	began := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	ran := time.Since(began)
	pid := int64(cmd.Process.Pid)
	time.Sleep(1500 * time.Millisecond) // its last report
	if err := pr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	totals := typedTotals(ps.AllProfiles())
	off := time.Duration(totals["off_cpu"][pid])
	wall := time.Duration(totals["wall"][pid])
	t.Logf("fixture ran %v: off_cpu %v, wall %v; off_cpu of %d processes", ran.Round(time.Millisecond), off, wall, len(totals["off_cpu"]))
	// It slept 10 ms at a time for 2 s; the first waits, before the filter
	// knew it, are left out (dropped{reason="undecided"}).
	if off < 1500*time.Millisecond || off > ran {
		t.Errorf("off_cpu time %v, the fixture ran %v asleep", off, ran)
	}
	if wall < off {
		t.Errorf("wall profile %v less than its off_cpu time %v", wall, off)
	}
	for p := range totals["off_cpu"] {
		if p != pid {
			t.Errorf("process %d has an off_cpu profile, but off_cpu.targets selects only %d", p, pid)
		}
	}
	seen := sumInt(t, tt, "otelcol_receiver_profiling_off_cpu_waits_seen")
	kept := sumInt(t, tt, "otelcol_receiver_profiling_off_cpu_waits_kept")
	chosen := sumInt(t, tt, "otelcol_receiver_profiling_off_cpu_waits_chosen")
	t.Logf("telemetry: waits seen %d, chosen %d, kept %d", seen, chosen, kept)
	if kept < 150 || chosen < kept || seen < chosen {
		t.Errorf("waits seen %d, chosen %d, kept %d: want about 200 kept, seen >= chosen >= kept", seen, chosen, kept)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds open after shutdown, %d before", got, fds)
	}
}
