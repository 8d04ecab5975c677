package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// staticBinaries builds a small static Go program as both binaries the
// image holds, for arch, into a directory.
func staticBinaries(t *testing.T, arch string) string {
	t.Helper()
	gobin := testfixture.NeedTool(t, "go")
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module imagetest\n\ngo 1.21\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() { println(\"hi\") }\n"), 0o644)
	dir := t.TempDir()
	for _, b := range binaries {
		cmd := exec.Command(gobin, "build", "-trimpath", "-o", filepath.Join(dir, b), ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	return dir
}

func write(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.oci.tar")
	if err := run(append([]string{"-o", out, "-ref", "example/img:1"}, args...)); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

// The same inputs give the same archive, byte for byte (so the same
// digests for the same commit); another creation time gives another.
func TestReproducible(t *testing.T) {
	amd, arm := staticBinaries(t, "amd64"), staticBinaries(t, "arm64")
	args := []string{"-created", "1700000000", "-arch", "amd64=" + amd, "-arch", "arm64=" + arm}
	a, err := write(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := write(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two runs on the same inputs wrote different archives")
	}
	// Touching the inputs changes nothing.
	for _, f := range binaries {
		os.Chtimes(filepath.Join(amd, f), time.Unix(1, 0), time.Unix(1, 0))
	}
	if c, err := write(t, args...); err != nil || !bytes.Equal(a, c) {
		t.Errorf("new file times changed the archive: %v", err)
	}
	args[1] = "1700000001"
	if c, _ := write(t, args...); bytes.Equal(a, c) {
		t.Error("another creation time gave the same archive")
	}
}

// A binary the empty base cannot run is refused: dynamically linked (no
// loader in the image), or of another architecture.
func TestRefusesWhatCannotRun(t *testing.T) {
	amd := staticBinaries(t, "amd64")
	if _, err := write(t, "-arch", "arm64="+amd); err == nil || !strings.Contains(err.Error(), "not arm64") {
		t.Errorf("amd64 binaries as arm64: %v", err)
	}
	gcc := testfixture.NeedTool(t, "gcc")
	dyn := t.TempDir()
	src := filepath.Join(dyn, "main.c")
	os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644)
	for _, b := range binaries {
		if out, err := exec.Command(gcc, "-o", filepath.Join(dyn, b), src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
	}
	if _, err := write(t, "-arch", runtime.GOARCH+"="+dyn); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic binaries: %v", err)
	}
	if _, err := write(t, "-arch", "amd64="+amd, "-ca-certificates", filepath.Join(dyn, "main.c")); err == nil || !strings.Contains(err.Error(), "no certificate") {
		t.Errorf("a CA bundle without certificates: %v", err)
	}
}
