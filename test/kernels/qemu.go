//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// qemuArgs boots kernel with initrd on arch, console on stdout.
func qemuArgs(cfg *config, arch, kernel, initrd string) (string, []string) {
	accel := "tcg,thread=" + cfg.tcgThreads
	if cfg.kvm {
		accel = "kvm"
	}
	common := []string{"-accel", accel, "-smp", "2", "-m", cfg.mem, "-nic", "none", "-display", "none",
		"-serial", "stdio", "-monitor", "none", "-no-reboot", "-kernel", kernel, "-initrd", initrd}
	// A kernel that hangs panics within seconds, with every CPU's
	// backtrace on the console (loglevel 5 shows them; quiet would not),
	// instead of leaving the VM to its timeout.
	const hang = "panic=-1 loglevel=5 softlockup_panic=1 softlockup_all_cpu_backtrace=1"
	if arch == "arm64" {
		// pauth-impdef: pointer authentication with QEMU's cheaper
		// algorithm, so PAC-signed return addresses are exercised.
		return "qemu-system-aarch64", append([]string{"-M", "virt", "-cpu", "max,pauth-impdef=on"},
			append(common, "-append", "console=ttyAMA0 "+hang)...)
	}
	cpu := "max"
	if cfg.kvm {
		cpu = "host"
	}
	return "qemu-system-x86_64", append([]string{"-M", "q35", "-cpu", cpu},
		append(common, "-append", "console=ttyS0 "+hang+" clocksource=tsc tsc=reliable")...)
}

// result is what one VM reported.
type result struct {
	target
	pkg, uname string
	wall       time.Duration
	bootSecs   float64 // kernel uptime when the tests began
	exits      map[string]int
	passed     []string
	failed     []string
	whole      map[string]string // fixture -> "99.5%"
	bpfNs      []string          // BPF ns per sample, as the tests logged them
	err        error
	log        string // console log file
	binaries   int    // test binaries the VM runs, each reporting an @@ EXIT
}

func (r *result) ok() bool {
	for _, code := range r.exits {
		if code != 0 {
			return false
		}
	}
	return r.err == nil && len(r.failed) == 0 && len(r.exits) == r.binaries
}

func (r *result) summary() string {
	if r.err != nil {
		return fmt.Sprintf("ERROR %v (console: %s)", r.err, r.log)
	}
	s := fmt.Sprintf("%d tests passed, %d failed, %v", len(r.passed), len(r.failed), r.wall.Round(time.Second))
	if len(r.failed) > 0 {
		s += " FAILED: " + strings.Join(r.failed, " ") + " (console: " + r.log + ")"
	}
	return s
}

var (
	passRe  = regexp.MustCompile(`^\s*--- PASS: (\S+)`)
	failRe  = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
	wholeRe = regexp.MustCompile(`\s([\w+.-]+): \d+/\d+ samples whole \(([\d.]+)%\)`)
	bpfRe   = regexp.MustCompile(`bpf_ns_per_sample=(\d+)`)
	exitRe  = regexp.MustCompile(`^@@ EXIT (\w+) (\d+)`)
	kernRe  = regexp.MustCompile(`^@@ KERNEL (.*), up ([\d.]+) s`)
)

// boot runs one VM to its end and reads what the tests said.
func boot(cfg *config, t target, kernel string, b *built, logf func(string, ...any)) *result {
	r := &result{target: t, exits: map[string]int{}, whole: map[string]string{}, binaries: b.binaries}
	r.log = filepath.Join(cfg.cache, "console-"+t.name+".log")
	bin, args := qemuArgs(cfg, t.arch, kernel, b.initrd)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.err = err
		return r
	}
	cmd.Stderr = cmd.Stdout
	logFile, err := os.Create(r.log)
	if err != nil {
		r.err = err
		return r
	}
	defer logFile.Close()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		r.err = err
		return r
	}
	r.parse(io.TeeReader(out, logFile), logf)
	werr := cmd.Wait()
	r.wall = time.Since(start)
	switch {
	case ctx.Err() != nil:
		r.err = fmt.Errorf("timed out after %v", cfg.timeout)
	case werr != nil:
		r.err = fmt.Errorf("%s: %v", bin, werr)
	case len(r.exits) < r.binaries:
		r.err = fmt.Errorf("the tests did not finish (kernel panic or a crash: see the console)")
	}
	return r
}

func (r *result) parse(in io.Reader, logf func(string, ...any)) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		if m := kernRe.FindStringSubmatch(l); m != nil {
			r.uname = m[1]
			r.bootSecs, _ = strconv.ParseFloat(m[2], 64)
			logf("%s: %s, tests start after %.1f s of boot", r.name, m[1], r.bootSecs)
		}
		if m := exitRe.FindStringSubmatch(l); m != nil {
			r.exits[m[1]], _ = strconv.Atoi(m[2])
		}
		if m := passRe.FindStringSubmatch(l); m != nil {
			r.passed = append(r.passed, m[1])
		}
		if m := failRe.FindStringSubmatch(l); m != nil {
			r.failed = append(r.failed, m[1])
			logf("%s: FAIL %s", r.name, m[1])
		}
		if m := wholeRe.FindStringSubmatch(l); m != nil {
			r.whole[m[1]] = m[2] + "%"
		}
		if m := bpfRe.FindStringSubmatch(l); m != nil {
			r.bpfNs = append(r.bpfNs, m[1])
		}
	}
}

// renderReport is the markdown table of the run.
func renderReport(rs []*result, images map[string]*built, total time.Duration) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n## test-kernels, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	sb.WriteString("| kernel | arch | tests | whole chains (fixture: %) | BPF ns/sample | boot | boot+tests |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		status := fmt.Sprintf("%d passed, %d failed", len(r.passed), len(r.failed))
		if len(r.failed) > 0 {
			// Named in the table: CI keeps only the tail of the output.
			status += ": " + strings.Join(r.failed, " ")
		}
		if r.err != nil {
			status = "error: " + r.err.Error()
		}
		var ws []string
		for k, v := range r.whole {
			ws = append(ws, k+" "+v)
		}
		sort.Strings(ws)
		uname := r.uname
		if uname == "" {
			uname = r.pkg
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %.1f s | %v |\n", uname, r.arch, status,
			strings.Join(ws, ", "), strings.Join(r.bpfNs, ", "), r.bootSecs, r.wall.Round(time.Second))
	}
	for arch, b := range images {
		fmt.Fprintf(&sb, "\n%s image built in %v.", arch, b.buildTime.Round(time.Second))
		for _, s := range b.skipped {
			fmt.Fprintf(&sb, " Not run: %s.", s)
		}
	}
	fmt.Fprintf(&sb, "\nTotal %v (qemu TCG: BPF and user time are emulated, compare kernels with each other, not with the host).\n",
		total.Round(time.Second))
	return sb.String()
}
