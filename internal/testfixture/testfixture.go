// Package testfixture compiles the test programs under testdata/src with the
// real toolchains (gcc, g++, go, rustc) and caches the results, so that every
// package's tests run against real binaries without committing any.
package testfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// InCI reports whether the tests run under CI, where missing tools or
// privileges are failures rather than reasons to skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips the test on a developer machine and fails it under CI.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
}

// SkipPart marks one part of t as not run (a build variant, a comparison
// with one tool) while the rest of t goes on: a skipped subtest named name
// on a developer machine, a failed one under CI. Coverage a missing tool
// costs is then in the test's result, never silently gone.
func SkipPart(t *testing.T, name, format string, args ...any) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Helper()
		SkipOrFail(t, format, args...)
	})
}

// NeedTool returns the path of an executable, trying each name in order, or
// skips/fails the test.
func NeedTool(t testing.TB, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	SkipOrFail(t, "none of %v is installed (see .ci/run for the packages)", names)
	return ""
}

// Root returns the repository root (the folder holding go.mod), or the
// folder EnvRepo names.
func Root(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvRepo); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Src returns the path of a file under testdata/src.
func Src(t testing.TB, name string) string {
	return filepath.Join(Root(t), "testdata", "src", name)
}

// Spec describes one fixture build.
type Spec struct {
	Name    string   // output file name, also part of the cache key
	Lang    string   // "c", "c++", "go" or "rust"
	Sources []string // paths under testdata/src (for go: one package folder)
	Args    []string // extra compiler flags
	// Compiler replaces the language's default compiler (e.g. "clang-19"
	// for "c"); Env adds variables to its environment (e.g. CGO_ENABLED=1).
	Compiler string
	Env      []string
}

// CacheDir is where built fixtures are kept between runs.
func CacheDir() string {
	if d := os.Getenv("PROFSYM_FIXTURE_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "profsym-fixtures")
}

// Build compiles spec (once per content hash) and returns the output path.
func Build(t testing.TB, spec Spec) (out string) {
	t.Helper()
	if p, ok := prebuilt(t, spec); ok {
		return p
	}
	orig, spec := spec, cross(t, spec)
	defer func() { export(t, orig, out) }()
	key := sha256.New()
	fmt.Fprintf(key, "%s\x00%s\x00%q\x00", spec.Name, spec.Lang, spec.Args)
	if spec.Compiler != "" || len(spec.Env) > 0 {
		fmt.Fprintf(key, "%s\x00%q\x00", spec.Compiler, spec.Env)
	}
	for _, s := range spec.Sources {
		p := Src(t, s)
		hashTree(t, key, p)
	}
	var compiler []string
	switch spec.Lang {
	case "c":
		compiler = []string{NeedTool(t, "gcc")}
	case "c++":
		compiler = []string{NeedTool(t, "g++")}
	case "go":
		compiler = []string{NeedTool(t, "go"), "build"}
	case "rust":
		compiler = []string{NeedTool(t, "rustc")}
	default:
		t.Fatalf("unknown fixture language %q", spec.Lang)
	}
	if spec.Compiler != "" {
		compiler[0] = NeedTool(t, spec.Compiler)
	}
	ver, _ := exec.Command(compiler[0], "--version").CombinedOutput()
	if spec.Lang == "go" {
		ver, _ = exec.Command(compiler[0], "version").CombinedOutput()
	}
	key.Write(ver)
	return Cached(t, hex.EncodeToString(key.Sum(nil))[:20], spec.Name, func(tmp string) {
		tmpOut := filepath.Join(tmp, spec.Name)
		var cmd *exec.Cmd
		switch spec.Lang {
		case "go":
			args := append([]string{"build", "-o", tmpOut}, spec.Args...)
			args = append(args, ".")
			cmd = exec.Command(compiler[0], args...)
			cmd.Dir = Src(t, spec.Sources[0])
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
			cmd.Env = append(cmd.Env, spec.Env...)
		default:
			args := append([]string{}, spec.Args...)
			args = append(args, "-o", tmpOut)
			for _, s := range spec.Sources {
				args = append(args, Src(t, s))
			}
			cmd = exec.Command(compiler[0], args...)
			cmd.Dir = tmp
			if len(spec.Env) > 0 {
				cmd.Env = append(os.Environ(), spec.Env...)
			}
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building fixture %s: %v\n%s\n%s", spec.Name, err, strings.Join(cmd.Args, " "), b)
		}
	})
}

// Cached returns CacheDir()/dir/name, made once by make, which writes name
// into the empty temporary directory it is given: the result appears only
// when complete, so a test killed midway leaves nothing half made. One
// lock per dir: building one fixture does not wait for another.
func Cached(t testing.TB, dir, name string, make func(tmp string)) string {
	t.Helper()
	dir = filepath.Join(CacheDir(), dir)
	out := filepath.Join(dir, name)
	l, _ := cacheLocks.LoadOrStore(dir, new(sync.Mutex))
	l.(*sync.Mutex).Lock()
	defer l.(*sync.Mutex).Unlock()
	if _, err := os.Stat(out); err == nil {
		return out
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(dir, "make-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	make(tmp)
	if err := os.Rename(filepath.Join(tmp, name), out); err != nil {
		t.Fatal(err)
	}
	return out
}

var cacheLocks sync.Map

func hashTree(t testing.TB, h interface{ Write([]byte) (int, error) }, p string) {
	err := filepath.Walk(p, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Run runs a command and fails the test with its output on error.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	b, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b)
}

// SplitDebug makes a stripped copy of bin plus a separate debug file, the way
// distributions package them. With link set, the stripped copy carries a
// .gnu_debuglink to the debug file, which sits next to it as NAME.debug.
// It returns (stripped, debug) paths inside a fresh folder.
func SplitDebug(t testing.TB, bin string, link bool) (string, string) {
	t.Helper()
	objcopy := NeedTool(t, "objcopy")
	dir := t.TempDir()
	base := filepath.Base(bin)
	stripped := filepath.Join(dir, base)
	debug := filepath.Join(dir, base+".debug")
	Run(t, objcopy, "--only-keep-debug", bin, debug)
	args := []string{"--strip-all"}
	if link {
		args = append(args, "--add-gnu-debuglink="+debug)
	}
	args = append(args, bin, stripped)
	Run(t, objcopy, args...)
	return stripped, debug
}

// Helm returns the helm binary (PATH, then $(go env GOPATH)/bin), or skips
// or fails the test. CI installs it: go install helm.sh/helm/v3/cmd/helm@v3.22.0
func Helm(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		gopath = strings.TrimSpace(string(out))
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "helm")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	SkipOrFail(t, "helm is not installed (go install helm.sh/helm/v3/cmd/helm@v3.22.0)")
	return ""
}

// Short skips t under go test -short (make test-short), CI or not: the
// developer's fast loop runs what needs no privilege, eBPF, VM or chroot,
// and need says which of those t needs.
func Short(t testing.TB, need string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s (make test runs it)", need)
	}
}
