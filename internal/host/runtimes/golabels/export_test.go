package golabels

import (
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/gopclntab"
)

func openELF(path string) (*elfx.File, error) { return elfx.Open(path) }

func goVersion(t *testing.T, f *elfx.File) string {
	t.Helper()
	v, err := gopclntab.GoVersion(f)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
