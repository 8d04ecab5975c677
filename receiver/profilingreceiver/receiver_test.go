package profilingreceiver

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadatatest"
)

// lifecycleHost is the generated lifecycle test's host: the test starts the
// real sampler, so machines without the privileges skip it (CI fails).
func lifecycleHost(t *testing.T) component.Host {
	t.Helper()
	needSampler(t)
	return componenttest.NewNopHost()
}

func needSampler(t testing.TB) {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
}

func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() || testing.Verbose() {
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			t.Logf("fd %s -> %s", e.Name(), l)
		}
	}
	return len(ents)
}

func buildC(t testing.TB) string {
	return testfixture.Build(t, testfixture.Spec{
		Name: "sampler-hot", Lang: "c",
		Sources: []string{"sampler/hot.c"}, Args: []string{"-O1", "-g", "-fno-omit-frame-pointer"},
	})
}

func pidsIn(pd []pprofile.Profiles) map[int64]int64 {
	out := map[int64]int64{}
	for _, p := range pd {
		for _, rp := range p.ResourceProfiles().All() {
			pid, _ := rp.Resource().Attributes().Get(pframe.AttrPID)
			for _, sp := range rp.ScopeProfiles().All() {
				for _, pr := range sp.Profiles().All() {
					for _, s := range pr.Samples().All() {
						out[pid.Int()] += s.Values().At(0)
					}
				}
			}
		}
	}
	return out
}

func logPids(ls []plog.Logs) map[int64]int {
	out := map[int64]int{}
	for _, l := range ls {
		for _, rl := range l.ResourceLogs().All() {
			for _, sl := range rl.ScopeLogs().All() {
				for _, lr := range sl.LogRecords().All() {
					pid, _ := lr.Attributes().Get("pid")
					out[pid.Int()]++
				}
			}
		}
	}
	return out
}

func sumInt(t *testing.T, tt *componenttest.Telemetry, name string) int64 {
	t.Helper()
	m, err := tt.GetMetric(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			n += dp.Value
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			n += dp.Value
		}
	}
	return n
}

// TestEndToEnd runs the receiver through the collector API: one factory,
// a profiles and a logs pipeline sharing one sampler, a real process.
func TestEndToEnd(t *testing.T) {
	needSampler(t)
	bin := buildC(t)
	ctx := context.Background()
	tt := componenttest.NewTelemetry()
	defer tt.Shutdown(ctx)
	fds := countFDs(t)

	f := NewFactory()
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.ReportInterval = time.Second
	set := metadatatest.NewSettings(tt)
	ps, ls := new(consumertest.ProfilesSink), new(consumertest.LogsSink)
	pr, err := f.CreateProfiles(ctx, set, cfg, ps)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := f.CreateLogs(ctx, set, cfg, ls)
	if err != nil {
		t.Fatal(err)
	}
	if pr.(*handle).e != lr.(*handle).e {
		t.Fatal("profiles and logs pipelines on one config got two receivers")
	}
	host := componenttest.NewNopHost()
	if err := pr.Start(ctx, host); err != nil {
		t.Fatal(err)
	}
	if err := lr.Start(ctx, host); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "2")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := int64(cmd.Process.Pid)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && pidsIn(ps.AllProfiles())[pid] == 0; {
		time.Sleep(100 * time.Millisecond)
	}
	if err := pr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	samples := pidsIn(ps.AllProfiles())[pid]
	records := logPids(ls.AllLogs())[pid]
	t.Logf("fixture pid %d: %d samples in %d profile batches, %d log records", pid, samples, len(ps.AllProfiles()), records)
	if samples < 50 {
		t.Errorf("only %d samples of the fixture arrived", samples)
	}
	if records == 0 {
		t.Errorf("no ProfileEvent records of the fixture arrived")
	}
	// The standard receiver metrics count every sample and record handed on.
	var handed, logged int64
	for _, pd := range ps.AllProfiles() {
		handed += int64(pd.SampleCount())
	}
	for _, ld := range ls.AllLogs() {
		logged += int64(ld.LogRecordCount())
	}
	if got := sumInt(t, tt, "otelcol_receiver_accepted_profile_samples"); got != handed || handed == 0 {
		t.Errorf("otelcol_receiver_accepted_profile_samples %d, %d samples handed on", got, handed)
	}
	if got := sumInt(t, tt, "otelcol_receiver_accepted_log_records"); got != logged || logged == 0 {
		t.Errorf("otelcol_receiver_accepted_log_records %d, %d records handed on", got, logged)
	}
	reported := sumInt(t, tt, "otelcol_receiver_profiling_samples")
	tracked := sumInt(t, tt, "otelcol_receiver_profiling_processes_tracked")
	t.Logf("telemetry: samples %d, processes tracked %d", reported, tracked)
	if reported < samples {
		t.Errorf("samples counter %d < %d samples of the fixture", reported, samples)
	}
	if _, err := tt.GetMetric("otelcol_receiver_profiling_report_duration"); err != nil {
		t.Errorf("report duration: %v", err)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds open after shutdown, %d before", got, fds)
	}
	if n := receivers.Len(); n != 0 {
		t.Errorf("%d shared receivers left after shutdown", n)
	}
}

// Without CAP_BPF/CAP_PERFMON Start fails with one line naming what is
// missing. The child is this test binary under setpriv.
func TestStartWithoutCapabilities(t *testing.T) {
	if os.Getenv("PROFSYM_RECEIVER_CHILD") == "nocaps" {
		f := NewFactory()
		r, err := f.CreateProfiles(context.Background(), receivertest.NewNopSettings(f.Type()), f.CreateDefaultConfig(), consumertest.NewNop())
		if err == nil {
			err = r.Start(context.Background(), componenttest.NewNopHost())
		}
		if err == nil {
			os.Stdout.WriteString("STARTED\n")
		} else {
			os.Stdout.WriteString("ERR: " + err.Error() + "\n")
		}
		os.Exit(0)
	}
	needSampler(t)
	setpriv := testfixture.NeedTool(t, "setpriv")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--bounding-set=-bpf,-perfmon,-sys_admin", "--inh-caps=-bpf,-perfmon,-sys_admin",
		exe, "-test.run=^TestStartWithoutCapabilities$")
	cmd.Env = append(os.Environ(), "PROFSYM_RECEIVER_CHILD=nocaps")
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("Start without capabilities hung")
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "ERR: ") || l == "STARTED" {
			lines = append(lines, l)
		}
	}
	t.Logf("child: %q", lines)
	if len(lines) != 1 || !strings.Contains(lines[0], "CAP_BPF and CAP_PERFMON") || strings.Contains(lines[0], "\n") {
		t.Errorf("child said %q (%v), want one line naming the missing capabilities", lines, err)
	}
}
