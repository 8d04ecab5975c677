package symbolstoreextension

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadatatest"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

const indexID = "0123456789abcdef0123456789abcdef01234567"

// The extension keeps symbol indexes for the processor: nothing before
// Start (absent, and no lease), then lease, put, locate through the
// store, counted by kind; a store reading this one over HTTP shares them.
func TestIndexes(t *testing.T) {
	ctx := context.Background()
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { tt.Shutdown(context.Background()) })
	cfg := createDefaultConfig()
	cfg.ServerConfig.NetAddr.Endpoint = fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(t))
	dir := t.TempDir()
	cfg.Storage.Directory = dir
	cfg.MaxIndexBytes = 1 << 20
	ext, err := newStore(metadatatest.NewSettings(tt), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ext.LocateIndex(ctx, indexID); !errors.Is(err, frame.ErrNotFound) {
		t.Errorf("LocateIndex before Start: %v, want not_found", err)
	}
	if held, release, err := ext.LeaseIndex(ctx, indexID); err == nil || held || release == nil {
		t.Errorf("LeaseIndex before Start: %v %v", held, err)
	}
	if err := ext.PutIndex(ctx, indexID, "/nonexistent"); err == nil {
		t.Error("PutIndex before Start succeeded")
	}
	if err := ext.Start(ctx, componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ext.Shutdown(context.Background()) })

	held, release, err := ext.LeaseIndex(ctx, indexID)
	if err != nil || !held {
		t.Fatalf("LeaseIndex: %v %v", held, err)
	}
	defer release()
	if again, r2, _ := ext.LeaseIndex(ctx, indexID); again {
		t.Error("the index lease was handed out twice")
	} else {
		r2()
	}
	data := bytes.Repeat([]byte("index "), 1000)
	p := filepath.Join(t.TempDir(), "idx")
	os.WriteFile(p, data, 0o600)
	if err := ext.PutIndex(ctx, indexID, p); err != nil {
		t.Fatal(err)
	}
	release()
	got, err := ext.LocateIndex(ctx, indexID)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Error("located index differs")
	}
	big := filepath.Join(t.TempDir(), "big")
	os.WriteFile(big, make([]byte, 1<<20+1), 0o600)
	if err := ext.PutIndex(ctx, "1123456789abcdef0123456789abcdef01234567", big); !errors.Is(err, frame.ErrLimitExceeded) {
		t.Errorf("index over max_index_bytes: %v", err)
	}
	kind := attribute.NewSet(attribute.String("kind", string(symstore.SymIndex)))
	metadatatest.AssertEqualSymbolstoreUploadsStored(t, tt, []metricdata.DataPoint[int64]{{Value: 1, Attributes: kind}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualSymbolstoreHits(t, tt, []metricdata.DataPoint[int64]{{Value: 1, Attributes: kind}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualSymbolstoreFiles(t, tt, []metricdata.DataPoint[int64]{{Value: 1}}, metricdatatest.IgnoreTimestamp())

	// A gateway reading this store over HTTP (the Helm chart's default)
	// shares its indexes: it reads the one stored here, and leases and
	// stores new ones here.
	rcfg := createDefaultConfig()
	rcfg.ServerConfig.NetAddr.Endpoint = ""
	rcfg.Storage.Remote.ClientConfig.Endpoint = "http://" + cfg.ServerConfig.NetAddr.Endpoint
	rcfg.Storage.ScratchDirectory = t.TempDir()
	remote, err := newStore(extensiontest.NewNopSettings(NewFactory().Type()), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Start(ctx, componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Shutdown(context.Background()) })
	if got, err := remote.LocateIndex(ctx, indexID); err != nil {
		t.Errorf("LocateIndex over a remote store: %v", err)
	} else if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Error("the remote copy of the index differs")
	}
	const id2 = "2123456789abcdef0123456789abcdef01234567"
	held, r, err := remote.LeaseIndex(ctx, id2)
	if err != nil || !held {
		t.Fatalf("LeaseIndex over a remote store: %v %v", held, err)
	}
	defer r()
	if again, r2, err := ext.LeaseIndex(ctx, id2); err != nil || again {
		t.Errorf("the owner handed out the lease a remote gateway holds: %v %v", again, err)
	} else {
		r2()
	}
	idx := append([]byte("PSYMIDX\x00"), data...)
	p2 := filepath.Join(t.TempDir(), "idx")
	os.WriteFile(p2, idx, 0o600)
	if err := remote.PutIndex(ctx, id2, p2); err != nil {
		t.Fatalf("PutIndex over a remote store: %v", err)
	}
	r()
	if b, _ := os.ReadFile(filepath.Join(dir, "buildid", id2, "symindex")); !bytes.Equal(b, idx) {
		t.Error("the owner does not hold the remote gateway's index")
	}
	if got, err := ext.LocateIndex(ctx, id2); err != nil {
		t.Errorf("the owner's LocateIndex of the remote gateway's index: %v", err)
	} else if b, _ := os.ReadFile(got); !bytes.Equal(b, idx) {
		t.Error("the owner's index differs")
	}
}
