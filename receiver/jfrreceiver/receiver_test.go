package jfrreceiver

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/receiver/jfrreceiver/internal/metadata"
	"github.com/profsym/profsym/receiver/jfrreceiver/internal/metadatatest"
)

const buildID = "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b"

func recording() []byte {
	r := jfrtest.New(1_700_000_000_000_000_000)
	r.Library(jfrtest.Library{Name: "/opt/lib/libnative.so", BuildID: buildID})
	java := jfrtest.JavaFrame("com/example/App", "run", 42)
	r.Sample(jfrtest.DatadogExecutionSample, 1000, 7, 1, jfrtest.RemoteFrame(buildID, 0x1a2b), java)
	r.Sample(jfrtest.DatadogMethodSample, 2000, 7, 2, java)
	r.Sample(jfrtest.JDKExecutionSample, 3000, 8, 1, java)
	return r.Bytes()
}

type server struct {
	url  string
	sink *consumertest.ProfilesSink
	tel  *componenttest.Telemetry
}

func start(t *testing.T, mod func(*Config)) *server {
	cfg := createDefaultConfig()
	cfg.NetAddr.Endpoint = "127.0.0.1:0"
	if mod != nil {
		mod(cfg)
	}
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	sink := new(consumertest.ProfilesSink)
	r, err := newReceiver(cfg, metadatatest.NewSettings(tel), sink)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	return &server{url: "http://" + r.Addr().String(), sink: sink, tel: tel}
}

func ddUpload(_ *testing.T, tags string, body []byte) (*bytes.Buffer, string) {
	return jfrtest.DatadogUpload(tags, body)
}

func post(t *testing.T, url, ctype string, body io.Reader) (int, string) {
	req, err := http.NewRequest(http.MethodPost, url, body)
	require.NoError(t, err)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDatadogIntake(t *testing.T) {
	s := start(t, nil)
	var l4 bytes.Buffer
	lw := lz4.NewWriter(&l4)
	lw.Write(recording())
	lw.Close()
	for name, body := range map[string][]byte{"zstd": jfrtest.Zstd(recording()), "lz4": l4.Bytes(), "plain": recording()} {
		s.sink.Reset()
		b, ct := ddUpload(t, "service:checkout,env:prod,version:1.2.3,host:web-1,runtime-id:5f0c-77,pid:4242,language:jvm,snapshot:periodic", body)
		code, msg := post(t, s.url+"/profiling/v1/input", ct, b)
		require.Equal(t, http.StatusOK, code, "%s: %s", name, msg)
		all := s.sink.AllProfiles()
		require.Len(t, all, 1, name)
		pd := all[0]
		res := pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw()
		require.Equal(t, map[string]any{"service.name": "checkout", "deployment.environment.name": "prod",
			"service.version": "1.2.3", "host.name": "web-1", "service.instance.id": "5f0c-77", "process.pid": int64(4242),
			"datadog.tag.language": "jvm", "datadog.tag.snapshot": "periodic", "telemetry.sdk.language": "java"}, res)
		require.Equal(t, 2, pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().Len(), "cpu and wall")
		requireRemote(t, pd)
	}
	metadatatest.AssertEqualReceiverJfrUploads(t, s.tel, []metricdata.DataPoint[int64]{{
		Attributes: attribute.NewSet(attribute.String("intake", "datadog"), attribute.String("outcome", "ok")), Value: 3}},
		metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreExemplars())
}

// requireRemote checks the remote frame arrived raw: a native location at
// the offset, on a mapping with the build id, for the processor to name.
func requireRemote(t *testing.T, pd pprofile.Profiles) {
	d := pdict.New(pd.Dictionary())
	found := false
	for _, loc := range pd.Dictionary().LocationTable().All() {
		if loc.MappingIndex() <= 0 || loc.Lines().Len() > 0 {
			continue
		}
		m := pd.Dictionary().MappingTable().At(int(loc.MappingIndex()))
		v, _ := d.FindAttr(m.AttributeIndices(), "process.executable.build_id.gnu")
		if v.Str() == buildID && loc.Address() == 0x1a2b && d.Str(m.FilenameStrindex()) == "/opt/lib/libnative.so" {
			found = true
		}
	}
	require.True(t, found, "raw remote frame")
}

func TestPyroscopeIngest(t *testing.T) {
	s := start(t, nil)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(recording())
	w.Close()
	code, msg := post(t, s.url+"/ingest?name=shop.cart%7Benv%3Dstaging%2Cregion%3Deu%7D&format=jfr&event=itimer&from=1700000000&until=1700000010&spyName=javaspy&sampleRate=100",
		"application/octet-stream", &gz)
	require.Equal(t, http.StatusOK, code, msg)
	pd := s.sink.AllProfiles()[0]
	require.Equal(t, map[string]any{"service.name": "shop.cart", "env": "staging", "region": "eu"},
		pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw())
	requireRemote(t, pd)

	// Multipart with jfr and labels, as the Pyroscope Java agent sends.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("jfr", "jfr")
	fw.Write(recording())
	lw, _ := mw.CreateFormFile("labels", "labels")
	lw.Write(labelsSnapshot())
	mw.Close()
	code, msg = post(t, s.url+"/ingest?name=app&format=jfr&event=wall", mw.FormDataContentType(), &buf)
	require.Equal(t, http.StatusOK, code, msg)
	pd = s.sink.AllProfiles()[1]
	// event=wall: jdk.ExecutionSample events are wall samples.
	d := pdict.New(pd.Dictionary())
	var types []string
	for _, p := range pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().All() {
		types = append(types, d.Str(p.PeriodType().TypeStrindex()))
	}
	require.Equal(t, []string{"cpu", "wall"}, types)
}

// labelsSnapshot encodes {contexts: {7: {labels: {1: 2}}}, strings: {1:
// "span_name", 2: "checkout"}}.
func labelsSnapshot() []byte {
	entry := func(k int64, v []byte) []byte {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.VarintType)
		e = protowire.AppendVarint(e, uint64(k))
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		return protowire.AppendBytes(e, v)
	}
	var label []byte
	label = protowire.AppendTag(label, 1, protowire.VarintType)
	label = protowire.AppendVarint(label, 1)
	label = protowire.AppendTag(label, 2, protowire.VarintType)
	label = protowire.AppendVarint(label, 2)
	var ctx []byte
	ctx = protowire.AppendTag(ctx, 1, protowire.BytesType)
	ctx = protowire.AppendBytes(ctx, label)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, entry(7, ctx))
	for id, s := range map[int64]string{1: "span_name", 2: "checkout"} {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, entry(id, []byte(s)))
	}
	return b
}

func TestParseLabels(t *testing.T) {
	got, strs, err := parseLabels(labelsSnapshot())
	require.NoError(t, err)
	require.Equal(t, map[int64]map[string]string{7: {"span_name": "checkout"}}, got)
	require.Equal(t, map[int64]string{1: "span_name", 2: "checkout"}, strs)
	_, _, err = parseLabels([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	require.Error(t, err)
}

// Hostile uploads each get a 4xx saying why, and the receiver keeps
// serving: a good upload right after each succeeds.
func TestHostileUploads(t *testing.T) {
	s := start(t, func(c *Config) {
		c.MaxRequestBodySize = 4 << 20
		c.MaxRecordingSize = 32 << 20
	})
	good := recording()
	trunc := good[:len(good)-100]
	magic := append([]byte("FLR\x01"), good[4:]...)
	huge := append([]byte(nil), good...)
	binary.BigEndian.PutUint64(huge[8:], 1<<40)
	cycle := cpCycle()
	bomb := jfrtest.ZstdBomb(1024) // 1 GiB of zeros
	require.Less(t, len(bomb), 4<<20, "the bomb must fit the body limit to reach the decompressor")
	big := make([]byte, 5<<20)
	cases := []struct {
		name string
		body []byte
		want int
		text string
	}{
		{"truncated chunk", trunc, 400, "truncated"},
		{"wrong magic", append([]byte("PK\x03\x04"), good[4:]...), 400, "magic"},
		{"bad magic byte", magic, 400, "magic"},
		{"huge declared chunk", huge, 413, "over the limit"},
		{"constant-pool cycle", cycle, 400, "cycle"},
		{"decompression bomb", bomb, 413, "expands past"},
		{"body over the limit", big, 413, "too large"},
	}
	for _, tc := range cases {
		b, ct := ddUpload(t, "service:x", tc.body)
		code, msg := post(t, s.url+"/profiling/v1/input", ct, b)
		require.Equal(t, tc.want, code, "%s: %s", tc.name, msg)
		require.Contains(t, strings.ToLower(msg), tc.text, tc.name)
		code, msg = post(t, s.url+"/ingest?name=x&format=jfr", "application/octet-stream", bytes.NewReader(tc.body))
		require.Equal(t, tc.want, code, "pyroscope %s: %s", tc.name, msg)

		b, ct = ddUpload(t, "service:x", good)
		code, msg = post(t, s.url+"/profiling/v1/input", ct, b)
		require.Equal(t, http.StatusOK, code, "after %s: %s", tc.name, msg)
	}
	code, _ := post(t, s.url+"/profiling/v1/input", "application/json", strings.NewReader("{}"))
	require.Equal(t, 400, code)
	code, _ = post(t, s.url+"/ingest?format=pprof", "", bytes.NewReader(good))
	require.Equal(t, 400, code)
	b, ct := ddUpload(t, "service:x", nil)
	code, _ = post(t, s.url+"/profiling/v1/input", ct, b)
	require.Equal(t, 400, code, "empty attachment")
	resp, err := http.Get(s.url + "/ingest")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// cpCycle is a recording whose constant-pool chain points forward.
func cpCycle() []byte {
	r := jfrtest.New(0)
	r.Uncompressed = true
	r.Sample(jfrtest.DatadogExecutionSample, 1, 1, 1, jfrtest.NativeFrame("f"))
	b, lay := r.Build()
	binary.BigEndian.PutUint64(b[lay.CPOffset+4+24:], 1)
	return b
}

func TestConsumerRefuses(t *testing.T) {
	cfg := createDefaultConfig()
	cfg.NetAddr.Endpoint = "127.0.0.1:0"
	r, err := newReceiver(cfg, metadatatest.NewSettings(componenttest.NewTelemetry()), consumertest.NewErr(fmt.Errorf("busy")))
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	defer r.Shutdown(context.Background())
	b, ct := ddUpload(t, "service:x", recording())
	code, _ := post(t, "http://"+r.Addr().String()+"/profiling/v1/input", ct, b)
	require.Equal(t, http.StatusServiceUnavailable, code)
}

func TestFactory(t *testing.T) {
	f := NewFactory()
	require.Equal(t, metadata.Type, f.Type())
	cfg := f.CreateDefaultConfig().(*Config)
	require.NoError(t, cfg.Validate())
	require.Equal(t, DefaultEndpoint, cfg.NetAddr.Endpoint)
	var _ component.Config = cfg
	_ = time.Second
}

// A real JDK recording with two sources of alloc (the sampler and the TLAB
// events): the left-out events are counted by type, as the converter saw.
func TestEventsLeftOutCounted(t *testing.T) {
	rec := jfrtest.RecordJDKWith(t, "Alloc", 1500,
		"settings=profile,jdk.ObjectAllocationInNewTLAB#enabled=true,jdk.ObjectAllocationOutsideTLAB#enabled=true")
	body, err := os.ReadFile(rec)
	require.NoError(t, err)
	_, st, err := jfrconv.ConvertBytes(body, jfrconv.Options{})
	require.NoError(t, err)
	require.NotEmpty(t, st.Ignored, "the recording has one source of each profile")
	s := start(t, nil)
	code, msg := post(t, s.url+"/ingest?name=alloc&format=jfr", "application/octet-stream", bytes.NewReader(body))
	require.Equal(t, http.StatusOK, code, msg)
	var want []metricdata.DataPoint[int64]
	for ev, n := range st.Ignored {
		want = append(want, metricdata.DataPoint[int64]{Attributes: attribute.NewSet(attribute.String("event", ev)), Value: n})
	}
	metadatatest.AssertEqualReceiverJfrEventsLeftOut(t, s.tel, want, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreExemplars())
}
