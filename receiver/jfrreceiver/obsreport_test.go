package jfrreceiver

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/profsym/profsym/receiver/jfrreceiver/internal/metadatatest"
)

// samplesMetric sums a receiverhelper counter over its data points, checking
// each names this receiver and its transport; -1 when it was never recorded.
func samplesMetric(t *testing.T, tel *componenttest.Telemetry, name string) int64 {
	t.Helper()
	m, err := tel.GetMetric(name)
	if err != nil {
		return -1
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is %T", name, m.Data)
	var n int64
	for _, dp := range sum.DataPoints {
		rcv, _ := dp.Attributes.Value(attribute.Key("receiver"))
		tr, _ := dp.Attributes.Value(attribute.Key("transport"))
		require.Equal(t, "jfr", rcv.AsString(), name)
		require.Equal(t, "http", tr.AsString(), name)
		n += dp.Value
	}
	return n
}

// TestObsReport: what an upload hands on counts in the standard
// otelcol_receiver_accepted_profile_samples, what the next consumer refuses
// in otelcol_receiver_refused_profile_samples, sample for sample.
func TestObsReport(t *testing.T) {
	upload := func(next xconsumer.Profiles) (*componenttest.Telemetry, int) {
		tel := componenttest.NewTelemetry()
		t.Cleanup(func() { tel.Shutdown(context.Background()) })
		cfg := createDefaultConfig()
		cfg.NetAddr.Endpoint = "127.0.0.1:0"
		r, err := newReceiver(cfg, metadatatest.NewSettings(tel), next)
		require.NoError(t, err)
		require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
		defer r.Shutdown(context.Background())
		b, ct := ddUpload(t, "service:x", recording())
		code, _ := post(t, "http://"+r.Addr().String()+"/profiling/v1/input", ct, b)
		return tel, code
	}
	sink := new(consumertest.ProfilesSink)
	tel, code := upload(sink)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, sink.AllProfiles(), 1)
	samples := int64(sink.AllProfiles()[0].SampleCount())
	require.Positive(t, samples)
	require.Equal(t, samples, samplesMetric(t, tel, "otelcol_receiver_accepted_profile_samples"))
	require.Equal(t, int64(0), samplesMetric(t, tel, "otelcol_receiver_refused_profile_samples"))

	tel, code = upload(consumertest.NewErr(errors.New("busy")))
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, samples, samplesMetric(t, tel, "otelcol_receiver_refused_profile_samples"))
	require.Equal(t, int64(0), samplesMetric(t, tel, "otelcol_receiver_accepted_profile_samples"))
}
