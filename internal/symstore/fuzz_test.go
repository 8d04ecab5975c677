package symstore

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// FuzzVerify feeds upload bodies to the store's verification: it must
// answer (accept or refuse with a reason), never panic or hang.
func FuzzVerify(f *testing.F) {
	bin := testfixture.Build(f, testfixture.Spec{Name: "fuzzverify", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=fuzzverify"}})
	data, err := os.ReadFile(extractTo(f, bin))
	if err != nil {
		f.Fatal(err)
	}
	id := testfixture.BuildID(f, bin)
	f.Add(data)
	f.Add(data[:len(data)/3])
	f.Add([]byte("\x7fELF"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "body")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if rerr := Verify(p, id, DebugInfo); rerr != nil && rerr.Reason == "" {
			t.Fatalf("refusal without a reason: %v", rerr)
		}
	})
}
