package jfrtest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// PeerModule is the Go module whose test data holds recordings made by real
// Java profilers (async-profiler 2 and 3, the Pyroscope Java agent,
// dd-trace-java with and without the Datadog profiler, IntelliJ's
// profiler), each with what Pyroscope's own converter makes of it.
const PeerModule = "github.com/grafana/jfr-parser@v0.11.0"

// PeerTestdata returns that module's parser/testdata directory, fetched
// into the Go module cache as any module is (skips, or fails under
// CI=true, when it cannot be had).
func PeerTestdata(t testing.TB) string {
	t.Helper()
	testfixture.NeedTool(t, "go")
	dir, err := PeerTestdataDir()
	if err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	return dir
}

// PeerTestdataDir is PeerTestdata for callers that do without it.
func PeerTestdataDir() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", PeerModule)
	tmp, err := os.MkdirTemp("", "peer-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd.Dir = tmp // outside this module: its go.mod and go.sum stay as they are
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &mod)
	}
	if err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", PeerModule, err, mod.Error)
	}
	return filepath.Join(mod.Dir, "parser", "testdata"), nil
}
