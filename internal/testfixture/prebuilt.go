package testfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

// Fixtures for machines without toolchains (test/kernels boots kernels in
// VMs with only the test binaries): the host builds them, for the VM's
// architecture, and the VM's tests take them from a directory.
const (
	// EnvPrebuilt names a directory Build takes fixtures from, building
	// nothing: a missing one fails the test.
	EnvPrebuilt = "PROFSYM_FIXTURES_PREBUILT"
	// EnvExport names a directory Build also copies what it builds into,
	// laid out for EnvPrebuilt.
	EnvExport = "PROFSYM_FIXTURES_EXPORT"
	// EnvGOARCH builds fixtures for another architecture with cross
	// toolchains (gcc-aarch64-linux-gnu, GOARCH=arm64, rustc --target).
	EnvGOARCH = "PROFSYM_FIXTURES_GOARCH"
	// EnvRustc and EnvRustSysroot name the rustc and the sysroot holding
	// the target's standard library for cross builds of Rust fixtures.
	EnvRustc       = "PROFSYM_FIXTURES_RUSTC"
	EnvRustSysroot = "PROFSYM_FIXTURES_RUST_SYSROOT"
)

// TargetArch is the GOARCH fixtures are built for.
func TargetArch() string {
	if a := os.Getenv(EnvGOARCH); a != "" {
		return a
	}
	return runtime.GOARCH
}

// prebuiltKey names a fixture independently of the toolchain that built
// it (a VM has none to ask): the spec and the target architecture.
func prebuiltKey(spec Spec) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%q\x00%s\x00%q\x00%s", spec.Name, spec.Lang, spec.Args, spec.Compiler, spec.Env, TargetArch())
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// prebuilt returns the fixture from EnvPrebuilt when it is set.
func prebuilt(t testing.TB, spec Spec) (string, bool) {
	dir := os.Getenv(EnvPrebuilt)
	if dir == "" {
		return "", false
	}
	p := filepath.Join(dir, prebuiltKey(spec), spec.Name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("fixture %s was not prebuilt into %s (%v): test/kernels builds them with TestFixturesBuild", spec.Name, dir, err)
	}
	return p, true
}

// export copies a built fixture into EnvExport when it is set.
func export(t testing.TB, spec Spec, built string) {
	dir := os.Getenv(EnvExport)
	if dir == "" || built == "" || t.Failed() {
		return
	}
	dst := filepath.Join(dir, prebuiltKey(spec), spec.Name)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(built)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// cross rewrites spec for EnvGOARCH's toolchains when it names another
// architecture than the host's. arm64 C and C++ fixtures are built with
// pointer authentication of return addresses (-mbranch-protection=standard),
// as distributions increasingly build arm64 code.
func cross(t testing.TB, spec Spec) Spec {
	arch := TargetArch()
	if arch == runtime.GOARCH {
		return spec
	}
	if arch != "arm64" {
		t.Fatalf("fixtures: no cross toolchain for %s", arch)
	}
	if spec.Compiler != "" {
		t.Fatalf("fixture %s: a compiler (%s) cannot be cross-built for %s", spec.Name, spec.Compiler, arch)
	}
	spec.Args = slices.Clone(spec.Args)
	switch spec.Lang {
	case "c":
		spec.Compiler = "aarch64-linux-gnu-gcc"
		spec.Args = append(spec.Args, "-mbranch-protection=standard")
	case "c++":
		spec.Compiler = "aarch64-linux-gnu-g++"
		spec.Args = append(spec.Args, "-mbranch-protection=standard")
	case "go":
		spec.Env = append(slices.Clone(spec.Env), "GOARCH="+arch)
	case "rust":
		spec.Compiler = os.Getenv(EnvRustc)
		if spec.Compiler == "" {
			spec.Compiler = "rustc"
		}
		spec.Args = append(spec.Args, "--target", "aarch64-unknown-linux-gnu", "-C", "linker=aarch64-linux-gnu-gcc")
		if sr := os.Getenv(EnvRustSysroot); sr != "" {
			spec.Args = append(spec.Args, "--sysroot", sr)
		}
	}
	return spec
}
