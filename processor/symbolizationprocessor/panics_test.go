package symbolizationprocessor

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

// panickingParser stands in for a parser bug on a hostile file.
func panickingParser() (err error) {
	defer contain.Panic(func(any) { err = errors.New("corrupt file") })
	var m map[string]int
	m["x"] = 1
	return nil
}

// A panic contained while the processor runs is in its telemetry
// (symbolization_parser_panics, the process's count) and its stack in the
// collector's log, once for its site.
func TestParserPanicsExported(t *testing.T) {
	cfg := createDefaultConfig()
	cfg.Sources = []string{"local"}
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	core, logs := observer.New(zapcore.InfoLevel)
	set := processortest.NewNopSettings(metadata.Type)
	set.TelemetrySettings = tel.NewTelemetrySettings()
	set.Logger = zap.New(core)
	p, err := NewFactory().CreateProfiles(context.Background(), set, cfg, new(consumertest.ProfilesSink))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	panickingParser()
	panickingParser()
	if err := p.ConsumeProfiles(context.Background(), pprofile.NewProfiles()); err != nil {
		t.Fatal(err)
	}
	h := &harness{tel: tel}
	if got, want := h.value(t, "otelcol_symbolization_parser_panics"), contain.Count(); got != want || got < 2 {
		t.Errorf("symbolization_parser_panics %d, want the process's %d (at least 2)", got, want)
	}
	if n := logs.FilterMessageSnippet("contained a panic").FilterField(zap.String("panic", "assignment to entry in nil map")).Len(); n != 1 {
		t.Errorf("%d log lines for the site's panics, want 1: %v", n, logs.All())
	}
}
