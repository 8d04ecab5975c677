package symbolizationprocessor

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

// storeExt stands for a symbol store extension: it keeps debug files by
// build id in a folder and hands the processor an in-process source.
type storeExt struct {
	component.StartFunc
	component.ShutdownFunc
	dir string
}

func (s *storeExt) SymbolSource() locate.Source { return storeSource{s.dir} }

type storeSource struct{ dir string }

func (storeSource) Name() string { return locate.SourceStore }

func (s storeSource) Find(_ context.Context, q *locate.Query) ([]locate.Candidate, error) {
	if q.ID.GNU == "" {
		return nil, nil
	}
	p := filepath.Join(s.dir, q.ID.GNU) // validated hex
	if _, err := os.Stat(p); err != nil {
		return nil, nil
	}
	return []locate.Candidate{{Path: p}}, nil
}

type extHost struct {
	component.Host
	ext map[component.ID]component.Component
}

func (h extHost) GetExtensions() map[component.ID]component.Component { return h.ext }

// The symbol_store source comes from the extension symbol_store names,
// through locate.SourceProvider.
func TestSymbolStoreSource(t *testing.T) {
	v := buildVariant(t, 10)
	dir := t.TempDir()
	data, _ := os.ReadFile(v.debug)
	os.WriteFile(filepath.Join(dir, v.id), data, 0o644)
	cfg := createDefaultConfig()
	cfg.Sources = []string{locate.SourceStore}
	cfg.SymbolStore = component.MustNewID("symbolstore")
	sink := new(consumertest.ProfilesSink)
	p, err := NewFactory().CreateProfiles(context.Background(), processortest.NewNopSettings(metadata.Type), cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	host := extHost{componenttest.NewNopHost(), map[component.ID]component.Component{
		component.MustNewID("symbolstore"): &storeExt{dir: dir}}}
	if err := p.Start(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if err := p.ConsumeProfiles(context.Background(), profile(v)); err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, sink.AllProfiles()[0]); got[0].name != "hot" {
		t.Errorf("frame from the store: %+v", got[0])
	}
}
