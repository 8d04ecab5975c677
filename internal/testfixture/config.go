package testfixture

import (
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
)

// LoadConfig unmarshals the section id ("type" or "type/name") of the
// package's testdata/config.yaml over cfg (a component's defaults) and
// validates the result as the collector does.
func LoadConfig(t testing.TB, cfg any, id string) error {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := cm.Sub(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Unmarshal(cfg); err != nil {
		return err
	}
	return confmap.Validate(cfg)
}

// WantErrors checks that err (an errors.Join of one error per line, as the
// components' Validate returns) holds exactly the errors want names, each by
// a part of its message.
func WantErrors(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	got := strings.Split(err.Error(), "\n")
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d errors (%q), want %d", len(got), err, len(want))
	}
}
