package config

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

func distribution(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testfixture.Root(t), "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(p); err != nil {
		// make test builds it first, so under CI this is a failure.
		testfixture.SkipOrFail(t, "the otelcol-profsym distribution is not built (make otelcol)")
	}
	return p
}

func configArgs(t *testing.T, names ...string) []string {
	var args []string
	for _, n := range names {
		args = append(args, "--config="+filepath.Join(testfixture.Root(t), "config", n))
	}
	return append(args, "--feature-gates=service.profilesSupport")
}

// Every shipped configuration, and each combination the README and docs
// give, validates with the distribution, with the environment they name.
func TestConfigsValidate(t *testing.T) {
	bin := distribution(t)
	env := []string{"PROFSYM_SYMBOLS_TOKEN=t0ken", "PROFSYM_SYMBOLS_ENDPOINT=http://symbols:8002",
		"PROFSYM_SYMBOLS_S3_ENDPOINT=minio:9000", "PROFSYM_SYMBOLS_S3_ACCESS_KEY=a", "PROFSYM_SYMBOLS_S3_SECRET_KEY=b"}
	for _, combo := range [][]string{
		{"default.yaml"}, {"logs.yaml"},
		{"agent.yaml"}, {"agent.yaml", "symbols-auth-agent.yaml"},
		{"gateway.yaml"}, {"gateway.yaml", "jfr.yaml"}, {"gateway.yaml", "gateway-backend.yaml"},
		{"gateway.yaml", "symbols-auth-gateway.yaml"}, {"gateway.yaml", "symbols-s3.yaml"},
		{"gateway.yaml", "symbols-remote.yaml", "symbols-auth-gateway.yaml"},
		{"symbols-store.yaml"}, {"symbols-store.yaml", "symbols-auth-gateway.yaml"},
	} {
		cmd := exec.Command(bin, append([]string{"validate"}, configArgs(t, combo...)...)...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("validate %s: %v\n%s", strings.Join(combo, " + "), err, out)
		}
	}
}

// make run's output (config/default.yaml's file exporter) is rotated: at
// PROFSYM_OUTPUT_MAX_MB the file is renamed with a timestamp and a new one
// started, and at most PROFSYM_OUTPUT_BACKUPS old ones are kept; every
// file holds whole OTLP JSON documents. It grew without bound before
// (6.6 MB in 42 s on a busy host).
func TestRunOutputRotates(t *testing.T) {
	bin := distribution(t)
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "make run samples this host: %v", err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "profiles.json")
	health := fmt.Sprintf("127.%d.%d.%d:13133", 1+rand.IntN(250), rand.IntN(250), 1+rand.IntN(250))
	cmd := exec.Command(bin, configArgs(t, "default.yaml")...)
	cmd.Env = append(os.Environ(), "PROFSYM_OUTPUT="+out, "PROFSYM_OUTPUT_MAX_MB=1", "PROFSYM_OUTPUT_BACKUPS=2",
		"PROFSYM_REPORT_INTERVAL=500ms", "PROFSYM_HEALTH_ENDPOINT="+health)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	// Work to sample, so reports are not empty on a quiet machine.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for x := 0; ; x++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = x * x
		}
	}()

	backups := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "profiles-*.json"))
		return m
	}
	// Three rotations: the oldest of three old files is deleted.
	seen := map[string]bool{}
	deadline := time.Now().Add(3 * time.Minute)
	for len(seen) < 3 && time.Now().Before(deadline) {
		if cmd.ProcessState != nil {
			t.Fatalf("the collector exited:\n%s", log.String())
		}
		for _, b := range backups() {
			seen[b] = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(seen) == 0 {
		fi, _ := os.Stat(out)
		t.Fatalf("no rotation within 3 minutes (current file %v):\n%s", fi, lastLines(log.String(), 20))
	}
	t.Logf("%d rotations", len(seen))
	// Let the exporter's deletion of the oldest catch up, then count.
	time.Sleep(time.Second)
	if n := len(backups()); n > 2 || len(seen) >= 3 && n != 2 {
		t.Errorf("%d old files kept, want at most 2: %v", n, backups())
	}
	var um pprofile.JSONUnmarshaler
	for _, f := range append(backups(), out) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err) // the oldest may go between listing and reading: rare, and then visible
		}
		if len(b) > 1<<20+1<<20/2 {
			t.Errorf("%s: %d bytes, rotated at 1 MiB", f, len(b))
		}
		docs := 0
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			if _, err := um.UnmarshalProfiles(line); err != nil && f != out {
				t.Errorf("%s: a document that does not parse: %v", f, err)
			}
			docs++
		}
		t.Logf("%s: %d bytes, %d documents", filepath.Base(f), len(b), docs)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Every complete configuration in the docs (a yaml block with a service
// section) validates with the distribution as written: no exporter used
// but not defined, no key the components do not know.
func TestDocsSnippetsValidate(t *testing.T) {
	bin := distribution(t)
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	docs, _ := filepath.Glob(filepath.Join(testfixture.Root(t), "docs", "*.md"))
	docs = append(docs, filepath.Join(testfixture.Root(t), "README.md"))
	n := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllSubmatchIndex(b, -1) {
			snippet := b[m[2]:m[3]]
			if !regexp.MustCompile(`(?m)^service:`).Match(snippet) {
				continue // a fragment, or Helm values
			}
			n++
			line := bytes.Count(b[:m[0]], []byte("\n")) + 1
			f := filepath.Join(t.TempDir(), "snippet.yaml")
			os.WriteFile(f, snippet, 0o644)
			out, err := exec.Command(bin, "validate", "--config="+f, "--feature-gates=service.profilesSupport").CombinedOutput()
			if err != nil {
				t.Errorf("%s:%d does not validate: %v\n%s\n%s", filepath.Base(doc), line, err, out, snippet)
			}
		}
	}
	if n == 0 {
		t.Fatal("no complete configuration found in the docs")
	}
	t.Logf("%d configurations in the docs validate", n)
}
