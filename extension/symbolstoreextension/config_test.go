package symbolstoreextension

import (
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string) (*Config, error) {
		cfg := createDefaultConfig()
		sub, err := cm.Sub(component.NewIDWithName(metadata.Type, name).String())
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.Unmarshal(cfg); err != nil {
			return nil, err
		}
		return cfg, confmap.Validate(cfg)
	}
	def, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if def.MaxStoredBytes != 16<<30 || def.MaxObjects != 500_000 {
		t.Errorf("capacity defaults: %d bytes, %d objects", def.MaxStoredBytes, def.MaxObjects)
	}
	if def.ServerConfig.NetAddr.Endpoint != DefaultEndpoint || def.Storage.Directory != "./out/symbols" || def.ServerConfig.Auth.HasValue() {
		t.Errorf("defaults: %+v", def)
	}
	s3, err := load("s3")
	if err != nil {
		t.Fatal(err)
	}
	if s3.Storage.S3.Bucket != "symbols" || string(s3.Storage.S3.SecretAccessKey) != "s3cr3t" || !s3.Storage.S3.Insecure ||
		s3.MaxUploadSize != 256<<20 || s3.LeaseDuration != 30*time.Second || s3.MaxQueryIDs != 5000 ||
		s3.MaxStoredBytes != 100<<30 || s3.MaxObjects != 2_000_000 ||
		!s3.ServerConfig.Auth.HasValue() || s3.ServerConfig.Auth.Get().Config.AuthenticatorID.String() != "bearertokenauth/symbols" {
		t.Errorf("s3: %+v", s3)
	}
	remote, err := load("remote")
	if err != nil {
		t.Fatal(err)
	}
	if rc := remote.Storage.Remote.ClientConfig; !remote.remote() || rc.Endpoint != "http://profsym-symbols.profiling.svc:8002" ||
		!rc.Auth.HasValue() || rc.Auth.Get().AuthenticatorID.String() != "bearertokenauth/symbols" || remote.Storage.Rescan != 10*time.Second {
		t.Errorf("remote: %+v", remote.Storage)
	}
	for _, bad := range []string{"nostorage", "badsize", "badcapacity", "remotebad", "remoteands3"} {
		if _, err := load(bad); err == nil {
			t.Errorf("%s: no validation error", bad)
		}
	}
}
