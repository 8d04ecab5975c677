//go:build linux

// Command kernels runs the sampler's and the unwinder's real tests on the
// kernels users run: Debian's cloud kernels (5.10, 6.1, a newer one, and
// arm64), each booted in qemu with a busybox initramfs holding the test
// binaries (go test -c), the fixtures prebuilt on the host (the VM has no
// toolchain) and their shared libraries. It prints a table of what passed
// and what was measured on each kernel (docs/kernels.md carries it).
//
//	go run ./test/kernels [-only 5.10,arm64-6.1] [-cache DIR] [-out FILE]
//
// Kernels, packages and images are cached under -cache ($PROFSYM_KERNEL_CACHE,
// default ~/.cache/profsym/kernels) between runs. qemu runs with TCG: KVM
// is used only with -kvm (this project's machines expose a /dev/kvm that
// cannot boot these kernels).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// target is one kernel of the matrix.
type target struct {
	name  string // what -only and the report call it
	arch  string // GOARCH
	suite string // Debian release whose cloud kernel it is
	who   string // who runs this kernel
}

// runtimeArches are the architectures whose VM runs the CPython and HotSpot
// tests: the host's own make test runs them on x86-64.
var runtimeArches = []string{"arm64"}

var matrix = []target{
	{"5.10", "amd64", "bullseye", "Debian 11, Amazon Linux 2 (5.10)"},
	{"6.1", "amd64", "bookworm", "Debian 12, Amazon Linux 2023"},
	{"6.12", "amd64", "trixie", "Debian 13, RHEL 10 (6.12)"},
	{"arm64-6.1", "arm64", "bookworm", "Debian 12 on Graviton/Ampere"},
}

// The tests run inside each VM: everything of the sampler, and the
// unwinder's whole-chain, lifecycle and mode tests (its unit and peer tests
// need no kernel and run on the host).
const (
	samplerRun = "."
	// The CPython walker's chains, where runtimeArches says (Debian's
	// python3.11 of that architecture, unpacked into the image).
	cpythonRun = "^TestPythonChains$"
	// The HotSpot walker's chains there too (trixie's OpenJDK 21):
	// interpreted, C1, and C2 with its inlining pinned (the plain C2
	// mode, which reaches the same code less surely, costs 30 s more).
	hotspotRun = "^TestJavaChains$/^jdk21-arm64$/^(interpreted|c1|c2-pinned)$"
	unwindRun  = "^(TestFixturesBuild|TestWholeChains|TestGoReachesMain|TestDlopenAfterStart|TestExecReplacesTables|TestExitForgetsProcess|TestExitMarksProcess|TestFramePointersMode)$"
)

type config struct {
	cache, out, root string
	kvm              bool
	timeout          time.Duration
	mem              string
	// What runs in the VM: -test.run patterns ("" runs none of that
	// binary) and -test.count, to chase a rare failure on one kernel.
	samplerRun, unwindRun, cpythonRun, hotspotRun string
	count                                         int
	tcgThreads                                    string
}

func main() {
	var cfg config
	only := flag.String("only", "", "comma-separated kernels to run (default: all of "+names()+")")
	flag.StringVar(&cfg.cache, "cache", defaultCache(), "cache directory for packages, kernels and images")
	flag.StringVar(&cfg.out, "out", "_build/test-kernels.md", "where to write the results table")
	flag.BoolVar(&cfg.kvm, "kvm", false, "use KVM instead of TCG")
	flag.DurationVar(&cfg.timeout, "timeout", 12*time.Minute, "limit per VM (boot and tests)")
	flag.StringVar(&cfg.mem, "mem", "3G", "VM memory (the arm64 image holds a JDK and a Python)")
	flag.StringVar(&cfg.samplerRun, "sampler-run", samplerRun, "-test.run of the sampler's tests in the VM (empty: none)")
	flag.StringVar(&cfg.unwindRun, "unwind-run", unwindRun, "-test.run of the unwinder's tests in the VM (empty: none)")
	flag.StringVar(&cfg.cpythonRun, "cpython-run", cpythonRun, "-test.run of the CPython walker's tests in the VMs of "+strings.Join(runtimeArches, ",")+" (empty: none)")
	flag.StringVar(&cfg.hotspotRun, "hotspot-run", hotspotRun, "-test.run of the HotSpot walker's tests in the VMs of "+strings.Join(runtimeArches, ",")+" (empty: none)")
	flag.IntVar(&cfg.count, "count", 1, "-test.count in the VM")
	flag.StringVar(&cfg.tcgThreads, "tcg-threads", "single", "TCG's vCPU threads, single or multi (multi: faster, but see docs/kernels.md)")
	flag.Parse()
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "test-kernels: "+format+"\n", args...)
	}
	root, err := os.Getwd()
	if err != nil {
		fatal(err)
	}
	cfg.root = root
	var run []target
	for _, t := range matrix {
		if *only == "" || slices.Contains(strings.Split(*only, ","), t.name) {
			run = append(run, t)
		}
	}
	if len(run) == 0 {
		fatal(fmt.Errorf("-only %q names none of %s", *only, names()))
	}
	if err := os.MkdirAll(cfg.cache, 0o755); err != nil {
		fatal(err)
	}
	a, err := newApt(cfg.cache)
	if err != nil {
		fatal(err)
	}
	if err := a.update(log); err != nil {
		log("%v (going on with the cache)", err)
	}
	start := time.Now()
	images := map[string]*built{}
	var results []*result
	failed := false
	for _, t := range run {
		b := images[t.arch]
		if b == nil {
			t0 := time.Now()
			if b, err = build(&cfg, a, t.arch, log); err != nil {
				fatal(fmt.Errorf("%s image: %w", t.arch, err))
			}
			b.buildTime = time.Since(t0)
			images[t.arch] = b
			log("%s image built in %v: %s", t.arch, b.buildTime.Round(time.Second), b.initrd)
		}
		kernel, pkg, err := fetchKernel(a, cfg.cache, t.arch, t.suite, log)
		if err != nil {
			fatal(fmt.Errorf("kernel %s: %w", t.name, err))
		}
		log("booting %s (%s)", t.name, pkg)
		r := boot(&cfg, t, kernel, b, log)
		r.pkg = pkg
		results = append(results, r)
		if !r.ok() {
			failed = true
		}
		log("%s: %s", t.name, r.summary())
	}
	report := renderReport(results, images, time.Since(start))
	fmt.Print(report)
	if cfg.out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err == nil {
			_ = os.WriteFile(cfg.out, []byte(report), 0o644)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func names() string {
	var n []string
	for _, t := range matrix {
		n = append(n, t.name)
	}
	return strings.Join(n, ",")
}

func defaultCache() string {
	if d := os.Getenv("PROFSYM_KERNEL_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "profsym", "kernels")
	}
	return filepath.Join(os.TempDir(), "profsym-kernels")
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "test-kernels: %v\n", err)
	os.Exit(2)
}

// built is one architecture's initramfs and what went into it.
type built struct {
	initrd    string
	skipped   []string // tests left out, and why
	python    bool     // the image runs the CPython tests
	java      bool     // and the HotSpot tests
	buildTime time.Duration
}

// build compiles the test binaries and fixtures for arch and writes the
// initramfs.
func build(cfg *config, a *apt, arch string, logf func(string, ...any)) (*built, error) {
	dir := filepath.Join(cfg.cache, "image-"+arch)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	b := &built{initrd: filepath.Join(dir, "initrd.cpio")}
	env := append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
	tests := map[string]string{}
	for _, p := range []string{"sampler", "unwind"} {
		out := filepath.Join(dir, p+".test")
		if err := runCmd(cfg.root, env, "go", "test", "-c", "-o", out, "./internal/host/"+p); err != nil {
			return nil, err
		}
		tests[p+".test"] = out
	}
	// Fixtures: the packages' own TestFixturesBuild, exporting what it builds.
	fix := filepath.Join(dir, "fixtures")
	fenv := append(os.Environ(), "PROFSYM_FIXTURES_EXPORT="+fix, "PROFSYM_FIXTURES_GOARCH="+arch)
	skip := ""
	if arch != runtime.GOARCH {
		rustc, sysroot, err := rustCross(a, cfg.cache, arch)
		if err != nil {
			logf("no Rust standard library for %s (%v): the rust fixture is not run there", arch, err)
			b.skipped = append(b.skipped, "TestWholeChains/rust: no Rust standard library for "+arch)
			skip = "TestFixturesBuild/unwind-chain-rs"
		} else {
			fenv = append(fenv, "PROFSYM_FIXTURES_RUSTC="+rustc, "PROFSYM_FIXTURES_RUST_SYSROOT="+sysroot)
		}
	}
	args := []string{"test", "-count=1", "-run", "^TestFixturesBuild$", "./internal/host/sampler", "./internal/host/unwind"}
	if skip != "" {
		args = append(args, "-skip", skip)
	}
	if err := runCmd(cfg.root, append(fenv, "CI=true"), "go", args...); err != nil {
		return nil, fmt.Errorf("building fixtures: %w", err)
	}
	bb := "/usr/bin/busybox"
	var err error
	if arch != runtime.GOARCH {
		if bb, err = busyboxFor(a, cfg.cache, arch); err != nil {
			return nil, err
		}
	}
	// Under TCG the agent's own code (table builds) runs 10-30 times
	// slower: the tests' start-up window for marked samples stretches.
	scale := 10
	if cfg.kvm {
		scale = 1
	}
	im := &image{arch: arch, busybox: bb, tests: tests, fixtures: fix, src: cfg.root}
	// testBinary compiles a package's tests for arch into the image.
	testBinary := func(name, pkg string) error {
		out := filepath.Join(dir, name+".test")
		if err := runCmd(cfg.root, env, "go", "test", "-c", "-o", out, pkg); err != nil {
			return err
		}
		tests[name+".test"] = out
		return nil
	}
	if cfg.cpythonRun != "" && slices.Contains(runtimeArches, arch) {
		if err := testBinary("cpython", "./internal/host/runtimes/cpython"); err != nil {
			return nil, err
		}
		if im.python, err = pythonRoot(a, cfg.cache, arch, bb); err != nil {
			return nil, fmt.Errorf("python for %s: %w", arch, err)
		}
	}
	if cfg.hotspotRun != "" && slices.Contains(runtimeArches, arch) {
		if err := testBinary("hotspot", "./internal/host/runtimes/hotspot"); err != nil {
			return nil, err
		}
		if im.java, err = javaRoot(a, cfg.cache, arch, bb); err != nil {
			return nil, fmt.Errorf("java for %s: %w", arch, err)
		}
		im.javaFix = filepath.Join(dir, "javafix")
		if err := javaFixtures(cfg.root, im.javaFix); err != nil {
			return nil, fmt.Errorf("java fixtures: %w", err)
		}
	}
	b.python, b.java = im.python != "", im.java != ""
	im.script = initScript(cfg, b.skipped, scale, b.python, b.java, arch)
	return b, im.write(b.initrd)
}

func runCmd(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// busyboxFor fetches Debian's static busybox for arch.
func busyboxFor(a *apt, cache, arch string) (string, error) {
	ver, err := a.candidate("busybox-static:"+arch, "bookworm")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "pkgs", "busybox-static-"+arch+"-"+ver)
	if err := a.download("busybox-static:"+arch+"="+ver, dir); err != nil {
		return "", err
	}
	return filepath.Join(dir, "bin", "busybox"), nil
}

// rustCross returns a rustc and a sysroot that build for arch: Debian's
// rustc with Debian's standard library for arch (libstd-rust-dev of the same
// version), which the archive has while rustup's targets cannot be fetched.
func rustCross(a *apt, cache, arch string) (string, string, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "rustc").Output()
	if err != nil || len(out) == 0 {
		return "", "", fmt.Errorf("Debian's rustc is not installed")
	}
	ver := strings.TrimSpace(string(out))
	dir := filepath.Join(cache, "pkgs", "libstd-rust-dev-"+arch+"-"+ver)
	if err := a.download("libstd-rust-dev:"+arch+"="+ver, dir); err != nil {
		return "", "", err
	}
	return "/usr/bin/rustc", filepath.Join(dir, "usr"), nil
}

// initScript runs the tests and reports between @@ markers on the console.
func initScript(cfg *config, skipped []string, timeScale int, python, java bool, arch string) string {
	skip := ""
	for _, s := range skipped {
		t, _, _ := strings.Cut(s, ":")
		skip = t
	}
	skipArg := ""
	if skip != "" {
		skipArg = fmt.Sprintf(" -test.skip '%s'", skip)
	}
	// No retries: a test that fails once under the emulator is a bug in
	// the walk or in the test (its clocks scale with
	// PROFSYM_TEST_TIME_SCALE), and a second run would hide it.
	run := func(name, pattern, extra string) string {
		if pattern == "" {
			return ""
		}
		cmd := fmt.Sprintf("/tests/%s.test -test.v -test.count=%d -test.timeout 10m", name, max(cfg.count, 1))
		if name == "hotspot" {
			// The JVM's own start-up and JIT run 3-5 times slower
			// here than the host's, not the 10-30 of the agent's table
			// builds the other tests wait for.
			cmd = fmt.Sprintf("PROFSYM_TEST_TIME_SCALE=%d %s", min(timeScale, 4), cmd)
		}
		return fmt.Sprintf(`%[2]s -test.run '%[3]s'%[4]s 2>&1
code=$?
echo "@@ EXIT %[1]s $code"
`, name, cmd, pattern, extra)
	}
	pyEnv, pyRun := "", ""
	if python {
		// cpython.Interpreters takes this root instead of its chroots.
		pyEnv = "export PROFSYM_PYTHON_ROOT=/python PROFSYM_PYTHON=/usr/bin/python" + pythonVersion + " PROFSYM_TESTDATA_SRC=/src\n"
		pyRun = run("cpython", cfg.cpythonRun, "")
	}
	if java {
		pyEnv += "export " + javaEnv(arch) + "\n"
		pyRun += run("hotspot", cfg.hotspotRun, "")
	}
	return `#!/bin/busybox sh
set -o pipefail
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo 1 > /proc/sys/kernel/bpf_stats_enabled
export CI=true PROFSYM_FIXTURES_PREBUILT=/fixtures PATH=/bin HOME=/tmp TMPDIR=/tmp PROFSYM_TEST_TIME_SCALE=` + fmt.Sprint(timeScale) + `
` + pyEnv + `cd /tmp
echo "@@ KERNEL $(uname -r) $(uname -m) $(nproc) CPUs, up $(cut -d' ' -f1 /proc/uptime) s"
` + run("sampler", cfg.samplerRun, "") + run("unwind", cfg.unwindRun, skipArg) + pyRun + `echo "@@ DONE up $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
`
}
