package profilingreceiver

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/threadctx"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadata"
	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadatatest"
)

// fakeRuntime takes pids 1 and 2 (refusing 2), names nothing, and says
// what its walker failed.
type fakeRuntime struct{ errs map[string]uint64 }

func (fakeRuntime) Kind() runtimes.Kind { return runtimes.KindCPython }
func (fakeRuntime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	switch p.PID {
	case 1:
		return [][2]uint64{{0x1000, 0x2000}}, true, nil
	case 2:
		return nil, true, errors.New("unknown version")
	}
	return nil, false, nil
}
func (fakeRuntime) Forget(int) {}
func (fakeRuntime) Name(pid int, f runtimes.Frame) (runtimes.Symbol, error) {
	return runtimes.Symbol{}, runtimes.ErrNotAttached
}
func (r *fakeRuntime) Errors() map[string]uint64 { return r.errs }

// fakeLabeler says what a Go labels reader did.
type fakeLabeler struct{ st runtimes.LabelStats }

func (*fakeLabeler) Attach(*normalize.Process)           {}
func (*fakeLabeler) Forget(int)                          {}
func (*fakeLabeler) Labels(int, uint64) []runtimes.Label { return nil }
func (l *fakeLabeler) Stats() runtimes.LabelStats        { return l.st }
func (*fakeLabeler) Reading() int                        { return 0 }
func (*fakeLabeler) Close()                              {}

type nopUnwinder struct{}

func (nopUnwinder) SetRuntime(int, unwind.Runtime) error { return nil }

// The runtime metrics count what happened since the last report: a second
// report with nothing new adds nothing.
func TestRuntimeTelemetry(t *testing.T) {
	ctx := context.Background()
	tt := componenttest.NewTelemetry()
	defer tt.Shutdown(ctx)
	tel, err := metadata.NewTelemetryBuilder(tt.NewTelemetrySettings())
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{errs: map[string]uint64{"no_thread": 3}}
	set := runtimes.NewSet(zap.NewNop(), nopUnwinder{}, rt)
	lab := &fakeLabeler{st: runtimes.LabelStats{Attached: 2, Refused: map[string]uint64{"unsupported": 1}, Read: 9, Failed: 1}}
	set.SetLabeler(lab)
	set.Attach(&normalize.Process{PID: 1})
	set.Attach(&normalize.Process{PID: 2})
	for range 2 {
		_, _ = set.Name(1, runtimes.Frame{Kind: runtimes.FrameCPythonFirst})
	}
	r := &profilingReceiver{tel: tel}
	r.recordRuntimes(ctx, set, threadctx.Stats{Attached: 1, Refused: map[string]uint64{"unsupported": 1}})
	rt.errs = map[string]uint64{"no_thread": 5, "read": 1}
	lab.st = runtimes.LabelStats{Attached: 3, Refused: map[string]uint64{"unsupported": 1, "unreadable": 2}, Read: 20, Failed: 4}
	tc := threadctx.Stats{Attached: 4, Refused: map[string]uint64{"unsupported": 1, "not_loaded": 2}}
	r.recordRuntimes(ctx, set, tc)
	r.recordRuntimes(ctx, set, tc)

	one := func(n int64, kv ...attribute.KeyValue) metricdata.DataPoint[int64] {
		return metricdata.DataPoint[int64]{Value: n, Attributes: attribute.NewSet(kv...)}
	}
	opts := []metricdatatest.Option{metricdatatest.IgnoreTimestamp()}
	metadatatest.AssertEqualReceiverProfilingRuntimeAttached(t, tt, []metricdata.DataPoint[int64]{one(1)}, opts...)
	metadatatest.AssertEqualReceiverProfilingRuntimeRefused(t, tt,
		[]metricdata.DataPoint[int64]{one(1, attribute.String("runtime", "cpython"))}, opts...)
	metadatatest.AssertEqualReceiverProfilingRuntimeFramesUnnamed(t, tt,
		[]metricdata.DataPoint[int64]{one(2, attribute.String("reason", "runtime_not_attached"))}, opts...)
	metadatatest.AssertEqualReceiverProfilingRuntimeWalkErrors(t, tt, []metricdata.DataPoint[int64]{
		one(5, attribute.String("runtime", "cpython"), attribute.String("reason", "no_thread")),
		one(1, attribute.String("runtime", "cpython"), attribute.String("reason", "read")),
	}, opts...)
	metadatatest.AssertEqualReceiverProfilingGoLabelsProcesses(t, tt, []metricdata.DataPoint[int64]{one(3)}, opts...)
	metadatatest.AssertEqualReceiverProfilingGoLabelsRefused(t, tt, []metricdata.DataPoint[int64]{
		one(1, attribute.String("reason", "unsupported")),
		one(2, attribute.String("reason", "unreadable")),
	}, opts...)
	metadatatest.AssertEqualReceiverProfilingGoLabelsUnread(t, tt, []metricdata.DataPoint[int64]{one(4)}, opts...)
	metadatatest.AssertEqualReceiverProfilingThreadContextProcesses(t, tt, []metricdata.DataPoint[int64]{one(4)}, opts...)
	metadatatest.AssertEqualReceiverProfilingThreadContextRefused(t, tt, []metricdata.DataPoint[int64]{
		one(1, attribute.String("reason", "unsupported")),
		one(2, attribute.String("reason", "not_loaded")),
	}, opts...)
}
