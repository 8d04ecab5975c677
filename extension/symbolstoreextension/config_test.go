package symbolstoreextension

import (
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadata"
	"github.com/profsym/profsym/internal/testfixture"
)

// loadConfig reads testdata/config.yaml's configuration of that name over
// the defaults, and validates it.
func loadConfig(t *testing.T, name string) (*Config, error) {
	cfg := createDefaultConfig()
	err := testfixture.LoadConfig(t, cfg, component.NewIDWithName(metadata.Type, name).String())
	return cfg, err
}

func TestLoadConfig(t *testing.T) {
	load := func(name string) (*Config, error) { return loadConfig(t, name) }
	def, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if def.MaxStoredBytes != 16<<30 || def.MaxObjects != 500_000 || def.MaxIndexBytes != 1<<30 {
		t.Errorf("capacity defaults: %d bytes, %d objects, index %d bytes", def.MaxStoredBytes, def.MaxObjects, def.MaxIndexBytes)
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
		s3.MaxStoredBytes != 100<<30 || s3.MaxObjects != 2_000_000 || s3.MaxIndexBytes != 512<<20 ||
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
}

// Each bad configuration fails with the errors it should, and only those.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"nostorage", []string{"storage: set directory or s3.bucket"}},
		{"badsize", []string{"max_upload_size: -1 must be positive"}},
		{"badcapacity", []string{"max_stored_bytes and max_objects must be positive"}},
		{"badindex", []string{"max_index_bytes: 0 must be positive"}},
		{"remotebad", []string{`storage.remote.endpoint: "ftp://x" is not an http(s) URL`}},
		{"remoteands3", []string{"storage: set remote.endpoint or s3.bucket, not both"}},
		{"s3noendpoint", []string{"storage.s3.endpoint: required with a bucket"}},
		{"noendpoint", []string{"endpoint: required (host:port)"}},
		{"badlease", []string{"lease_duration and max_query_ids must be positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(t, tc.name)
			testfixture.WantErrors(t, err, tc.want...)
		})
	}
}
