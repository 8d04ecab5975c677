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
	"sync"
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
	// python3.11 of that architecture, unpacked into the image), and the
	// processes that forge its structures (sampled from their "ready"
	// line, after the loader: in the emulated VM its samples ran into the
	// window).
	cpythonRun = "^(TestPythonChains|TestForgedInterpreter)$"
	// The HotSpot walker's chains there too (trixie's OpenJDK 21):
	// interpreted, C1, C2, C2 with its inlining pinned, and C1 with
	// return addresses signed. Each compiled mode samples once the JIT
	// has compiled what it is about (hotspot's jitWatch), so emulation
	// costs them seconds, not a warm-up sized for the slowest run. And the
	// process forging a JVM's tables (its start-up's burst of snapshots
	// once refused walker-late for good here: attach failures are now
	// counted a second apart).
	hotspotRun = "^(TestJavaChains|TestHostileProcess)$"
	// The shipped binaries there too, as a user runs them (internal/e2e):
	// otelcol-profsym and profsym record naming that Python's and that
	// JDK's frames.
	e2eRun    = "^(TestCollectorPythonChains|TestRecordPythonChains|TestCollectorJavaChains|TestRecordJavaChains)$"
	unwindRun = "^(TestFixturesBuild|TestWholeChains|TestGoReachesMain|TestDlopenAfterStart|TestExecReplacesTables|TestExitForgetsProcess|TestExitMarksProcess|TestReusedPidDropsDeadTables|TestFramePointersMode)$"
)

type config struct {
	cache, out, root string
	kvm              bool
	timeout          time.Duration
	mem              string
	// What runs in the VM: -test.run patterns ("" runs none of that
	// binary) and -test.count, to chase a rare failure on one kernel.
	samplerRun, unwindRun, cpythonRun, hotspotRun, e2eRun string
	count                                                 int
	// built holds the distribution's binaries per architecture
	// (ARCH/otelcol-profsym, ARCH/profsym: make image's), which the
	// end-to-end tests run.
	built      string
	tcgThreads string
	jobs       int
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
	flag.StringVar(&cfg.e2eRun, "e2e-run", e2eRun, "-test.run of the end-to-end tests (the built binaries) in the VMs of "+strings.Join(runtimeArches, ",")+" (empty: none)")
	flag.StringVar(&cfg.built, "built", "_build/image", "the distribution's binaries, ARCH/otelcol-profsym and ARCH/profsym (make image builds them)")
	flag.IntVar(&cfg.count, "count", 1, "-test.count in the VM")
	flag.StringVar(&cfg.tcgThreads, "tcg-threads", "single", "TCG's vCPU threads, single or multi (multi: faster, but see docs/kernels.md)")
	flag.IntVar(&cfg.jobs, "jobs", 1, "VMs run at once (each keeps a host CPU busy; on the 2-CPU machines here two at once emulate 2-3 times slower and time-bound tests fail: docs/kernels.md)")
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
	// Every image and kernel first: a build beside a running VM would
	// take its CPU (the VMs' tests measure time and sample counts).
	images := map[string]*built{}
	kernels := make([]string, len(run))
	pkgs := make([]string, len(run))
	for i, t := range run {
		if images[t.arch] == nil {
			t0 := time.Now()
			b, err := build(&cfg, a, t.arch, log)
			if err != nil {
				fatal(fmt.Errorf("%s image: %w", t.arch, err))
			}
			b.buildTime = time.Since(t0)
			images[t.arch] = b
			log("%s image built in %v: %s", t.arch, b.buildTime.Round(time.Second), b.initrd)
		}
		if kernels[i], pkgs[i], err = fetchKernel(a, cfg.cache, t.arch, t.suite, log); err != nil {
			fatal(fmt.Errorf("kernel %s: %w", t.name, err))
		}
	}
	results := runVMs(&cfg, run, func(i int) *result {
		t := run[i]
		log("booting %s (%s)", t.name, pkgs[i])
		r := boot(&cfg, t, kernels[i], images[t.arch], log)
		r.pkg = pkgs[i]
		log("%s: %s", t.name, r.summary())
		return r
	})
	failed := slices.ContainsFunc(results, func(r *result) bool { return !r.ok() })
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

// runVMs runs one(i) for each target, cfg.jobs at a time, longest first
// (the VMs of runtimeArches carry the runtimes' tests: minutes more than
// the others), and returns the results in the matrix's order.
func runVMs(cfg *config, run []target, one func(int) *result) []*result {
	order := make([]int, len(run))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ra, rb := slices.Contains(runtimeArches, run[a].arch), slices.Contains(runtimeArches, run[b].arch)
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	results := make([]*result, len(run))
	next := make(chan int, len(order))
	for _, i := range order {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range max(cfg.jobs, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i] = one(i)
			}
		}()
	}
	wg.Wait()
	return results
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
	binaries  int      // test binaries the init script runs
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
	// The processes forging a runtime's structures.
	if cfg.cpythonRun != "" && slices.Contains(runtimeArches, arch) {
		args = append(args, "./internal/host/runtimes/cpython")
	}
	if cfg.hotspotRun != "" && slices.Contains(runtimeArches, arch) {
		args = append(args, "./internal/host/runtimes/hotspot")
	}
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
	im := &image{arch: arch, busybox: bb, tests: tests, fixtures: fix, repo: map[string]string{}}
	// testBinary compiles a package's tests for arch into the image.
	testBinary := func(name, pkg string) error {
		out := filepath.Join(dir, name+".test")
		if err := runCmd(cfg.root, env, "go", "test", "-c", "-o", out, pkg); err != nil {
			return err
		}
		tests[name+".test"] = out
		return nil
	}
	runs := []vmRun{{name: "sampler", pattern: cfg.samplerRun}, {name: "unwind", pattern: cfg.unwindRun, skip: skipPattern(b.skipped)}}
	if slices.Contains(runtimeArches, arch) {
		runs = append(runs, vmRun{name: "cpython", pattern: cfg.cpythonRun}, vmRun{name: "hotspot", pattern: cfg.hotspotRun}, vmRun{name: "e2e", pattern: cfg.e2eRun})
	}
	runs = slices.DeleteFunc(runs, func(r vmRun) bool { return r.pattern == "" })
	runsOf := func(names ...string) bool {
		return slices.ContainsFunc(runs, func(r vmRun) bool { return slices.Contains(names, r.name) })
	}
	for _, r := range runs {
		switch r.name {
		case "cpython":
			err = testBinary(r.name, "./internal/host/runtimes/cpython")
		case "hotspot":
			err = testBinary(r.name, "./internal/host/runtimes/hotspot")
		case "e2e":
			err = testBinary(r.name, "./internal/e2e")
		}
		if err != nil {
			return nil, err
		}
	}
	if runsOf("cpython", "e2e") {
		if im.python, err = pythonRoot(a, cfg.cache, arch, bb); err != nil {
			return nil, fmt.Errorf("python for %s: %w", arch, err)
		}
		for _, f := range []string{"runtimes/python/chain.py", "e2e/pychain.py"} {
			im.repo["testdata/src/"+f] = filepath.Join(cfg.root, "testdata/src", f)
		}
	}
	if runsOf("hotspot", "e2e") {
		if im.java, err = javaRoot(a, cfg.cache, arch, bb); err != nil {
			return nil, fmt.Errorf("java for %s: %w", arch, err)
		}
		im.javaFix = filepath.Join(dir, "javafix")
		if err := javaFixtures(cfg.root, im.javaFix); err != nil {
			return nil, fmt.Errorf("java fixtures: %w", err)
		}
		im.repo["testdata/src/e2e/JChain.java"] = filepath.Join(cfg.root, "testdata/src/e2e/JChain.java")
	}
	if runsOf("e2e") {
		// The binaries users run, as make image built them for arch.
		built := cfg.built
		if !filepath.IsAbs(built) {
			built = filepath.Join(cfg.root, built)
		}
		for _, n := range []string{"otelcol-profsym", "profsym"} {
			p := filepath.Join(built, arch, n)
			if _, err := os.Stat(p); err != nil {
				return nil, fmt.Errorf("the end-to-end tests run %s: %w (make image builds it; -e2e-run '' runs none)", p, err)
			}
			im.repo["_build/"+n] = p
		}
		im.repo["config/default.yaml"] = filepath.Join(cfg.root, "config/default.yaml")
	}
	b.binaries = len(runs)
	im.script = initScript(cfg, runs, scale, im.python != "", im.java != "", arch)
	return b, im.write(b.initrd)
}

// vmRun is one test binary the VM runs: its -test.run and -test.skip.
type vmRun struct {
	name, pattern, skip string
}

// skipPattern is the -test.skip of what the image cannot run ("Test/sub:
// why" each).
func skipPattern(skipped []string) string {
	skip := ""
	for _, s := range skipped {
		t, _, _ := strings.Cut(s, ":")
		skip = t
	}
	return skip
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
func initScript(cfg *config, runs []vmRun, timeScale int, python, java bool, arch string) string {
	// No retries: a test that fails once under the emulator is a bug in
	// the walk or in the test (its clocks scale with
	// PROFSYM_TEST_TIME_SCALE), and a second run would hide it.
	script := ""
	for _, r := range runs {
		cmd := fmt.Sprintf("/tests/%s.test -test.v -test.count=%d -test.timeout 10m -test.run '%s'", r.name, max(cfg.count, 1), r.pattern)
		if r.skip != "" {
			cmd += fmt.Sprintf(" -test.skip '%s'", r.skip)
		}
		if r.name == "hotspot" {
			// The JVM's own start-up and JIT run 3-5 times slower
			// here than the host's, not the 10-30 of the agent's table
			// builds the other tests wait for.
			cmd = fmt.Sprintf("PROFSYM_TEST_TIME_SCALE=%d %s", min(timeScale, 4), cmd)
		}
		script += fmt.Sprintf("%s 2>&1\ncode=$?\necho \"@@ EXIT %s $code\"\n", cmd, r.name)
	}
	env := "PROFSYM_REPO=/repo"
	if python {
		// The tests take this Python instead of their chroots'.
		env += " PROFSYM_PYTHON_ROOT=/python PROFSYM_PYTHON=/usr/bin/python" + pythonVersion
	}
	if java {
		env += " " + javaEnv(arch)
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
# The collector's health endpoint and the tests' free ports are on loopback.
ifconfig lo 127.0.0.1 up
export CI=true PROFSYM_FIXTURES_PREBUILT=/fixtures PATH=/bin HOME=/tmp TMPDIR=/tmp PROFSYM_TEST_TIME_SCALE=` + fmt.Sprint(timeScale) + `
export ` + env + `
cd /tmp
echo "@@ KERNEL $(uname -r) $(uname -m) $(nproc) CPUs, up $(cut -d' ' -f1 /proc/uptime) s"
` + script + `echo "@@ DONE up $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
`
}
