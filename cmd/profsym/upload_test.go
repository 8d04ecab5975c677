package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/internal/testfixture"
)

func TestUploadCommand(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "cliupload", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=cliupload"}})
	id := testfixture.BuildID(t, bin)
	_, debug := testfixture.SplitDebug(t, bin, false)
	other := testfixture.Build(t, testfixture.Spec{Name: "cliupload2", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=cliupload2"}})
	otherStripped, otherDebug := testfixture.SplitDebug(t, other, false)
	otherID := testfixture.BuildID(t, other)

	be, _ := symstore.NewDir(t.TempDir())
	store, _ := symstore.New(context.Background(), symstore.Config{Backend: be})
	h := store.Handler()
	// A stand-in for the bearertokenauth the gateway runs.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer ci-token" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("ci-token\n"), 0o600)
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("nope"), 0o600)

	upload := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"upload", "--endpoint", srv.URL}, args...), nil, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, e := upload("--token-file", bad, bin); code == 0 || !strings.Contains(e, "401") || store.Has(id, symstore.DebugInfo) {
		t.Errorf("wrong token: code %d, %s", code, e)
	}
	if code, o, e := upload("--token-file", tok, bin); code != 0 || !strings.Contains(o, "uploaded "+id) {
		t.Fatalf("upload: %d\n%s%s", code, o, e)
	}
	if code, o, _ := upload("--token-file", tok, bin); code != 0 || !strings.Contains(o, "already stored") {
		t.Errorf("second upload: %d %s", code, o)
	}
	// A stripped binary: its debug file is found by build id.
	if code, _, e := upload("--token-file", tok, "--debug-file-directory", t.TempDir(), otherStripped); code == 0 || !strings.Contains(e, "no symbols") {
		t.Errorf("stripped without debug file: %d %s", code, e)
	}
	dbgDir := t.TempDir()
	os.MkdirAll(filepath.Join(dbgDir, ".build-id", otherID[:2]), 0o755)
	data, _ := os.ReadFile(otherDebug)
	os.WriteFile(filepath.Join(dbgDir, ".build-id", otherID[:2], otherID[2:]+".debug"), data, 0o644)
	if code, o, e := upload("--token-file", tok, "--debug-file-directory", dbgDir, otherStripped); code != 0 || !store.Has(otherID, symstore.DebugInfo) {
		t.Errorf("stripped with debug dir: %d %s %s", code, o, e)
	}
	// A debug file given directly works too; a non-ELF file fails the run.
	if code, o, _ := upload("--token-file", tok, debug); code != 0 || !strings.Contains(o, "already stored") {
		t.Errorf("debug file: %d %s", code, o)
	}
	if code, _, _ := upload("--token-file", tok, tok); code == 0 {
		t.Error("a non-ELF input did not fail the run")
	}
	// A Go binary without a GNU build id goes under its Go build id.
	gobin := testfixture.Build(t, testfixture.Spec{Name: "cliuploadgo", Lang: "go", Sources: []string{"sampler/gohot"},
		Args: []string{"-ldflags=-B=none -X main.fixture=cliuploadgo"}})
	goID, err := exec.Command("go", "tool", "buildid", gobin).Output()
	if err != nil {
		t.Fatal(err)
	}
	key, err := symstore.GoKey(strings.TrimSpace(string(goID)))
	if err != nil {
		t.Fatal(err)
	}
	if code, o, e := upload("--token-file", tok, gobin); code != 0 || !strings.Contains(o, "uploaded "+key.String()) || !store.Has(key.String(), symstore.DebugInfo) {
		t.Errorf("Go binary: %d %s %s", code, o, e)
	}
}

// A store that takes the request and never answers fails the run, with
// its reason, after --response-timeout (one request) or --timeout (the
// whole run), whichever comes first; without them the command hung.
func TestUploadTimesOut(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "cliuploadhang", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-Wl,--build-id", "-DE2E_ID=cliuploadhang"}})
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-stop // never answers, not even when the client gives up
	}))
	defer srv.Close()
	defer close(stop)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"response-timeout", []string{"--response-timeout", "1s"}, "timeout awaiting response headers"},
		{"timeout", []string{"--timeout", "1s"}, "--timeout of 1s passed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			done := make(chan int, 1)
			start := time.Now()
			go func() {
				done <- run(append(append([]string{"upload", "--endpoint", srv.URL}, c.args...), bin), nil, &out, &errb)
			}()
			select {
			case code := <-done:
				if code != 1 || !strings.Contains(errb.String(), c.want) {
					t.Errorf("exit %d after %v, stderr %q; want 1 and %q", code, time.Since(start), errb.String(), c.want)
				}
			case <-time.After(time.Minute):
				t.Fatalf("profsym upload %v still waiting on a store that never answers after a minute", c.args)
			}
		})
	}
}
