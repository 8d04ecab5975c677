package jfrreceiver

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/profsym/profsym/internal/jfr/jfrtest"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// A recording the Pyroscope Java agent made with its OpenTelemetry span
// context (jfrtest.PeerModule's new_spancontext), uploaded as the agent
// uploads it: multipart, the gzip'd recording as `jfr`, its gzip'd
// LabelsSnapshot as `labels`. Every sample arrives (Pyroscope's converter
// counts 472), the pid comes from jdk.JVMInformation, and samples taken
// inside a span carry its id and name.
func TestPyroscopeAgentRecording(t *testing.T) {
	dir := jfrtest.PeerTestdata(t)
	rec, err := os.ReadFile(filepath.Join(dir, "new_spancontext.jfr.gz"))
	require.NoError(t, err)
	labels, err := os.ReadFile(filepath.Join(dir, "new_spancontext.labels.gz"))
	require.NoError(t, err)
	s := start(t, nil)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("jfr", "jfr")
	fw.Write(rec)
	lw, _ := mw.CreateFormFile("labels", "labels")
	lw.Write(labels)
	mw.Close()
	code, msg := post(t, s.url+"/ingest?name=fib%7Benv%3Dtest%7D&format=jfr&event=ctimer&sampleRate=100&spyName=javaspy", mw.FormDataContentType(), &buf)
	require.Equal(t, http.StatusOK, code, msg)
	pd := s.sink.AllProfiles()[0]
	require.Equal(t, map[string]any{"service.name": "fib", "env": "test", "process.pid": int64(159918)}, pd.ResourceProfiles().At(0).Resource().Attributes().AsRaw())

	d := pdict.New(pd.Dictionary())
	var total, inSpan int64
	spans := map[string]bool{}
	names := map[string]bool{}
	p := pd.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0)
	require.Equal(t, "cpu", d.Str(p.PeriodType().TypeStrindex()))
	for _, smp := range p.Samples().All() {
		v := smp.Values().At(0)
		total += v
		attrs := map[string]string{}
		for _, ai := range smp.AttributeIndices().All() {
			k, val, _ := d.Attr(ai)
			attrs[k] = val.AsString()
		}
		if id, ok := attrs["span_id"]; ok {
			require.Len(t, id, 16, "span id as 16 hex digits")
			inSpan += v
			spans[id] = true
			names[attrs["span_name"]] = true
		}
	}
	var nl []string
	for n := range names {
		nl = append(nl, n)
	}
	sort.Strings(nl)
	t.Logf("%d samples, %d in %d spans named %v", total, inSpan, len(spans), nl)
	require.EqualValues(t, 472, total)
	require.NotZero(t, inSpan)
	require.NotContains(t, names, "", "a span without its name")
}
