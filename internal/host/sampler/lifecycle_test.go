package sampler

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/testfixture"
)

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestLifecycle(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	forModes(t, func(t *testing.T, m Mode) {
		fds, gs := countFDs(t), runtime.NumGoroutine()
		for cycle := 0; cycle < 2; cycle++ {
			s, err := New(Config{SampleRate: 99, KernelStacks: true, Mode: m})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); !errors.Is(err, ErrStarted) {
				t.Errorf("second Start: %v, want ErrStarted", err)
			}
			// Burn CPU here: on a quiet machine nothing else may run to
			// be sampled.
			for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			}
			for i := 0; i < 3; i++ {
				if _, err := s.Drain(); err != nil {
					t.Fatal(err)
				}
			}
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.Samples == 0 {
				t.Error("no samples at all")
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if _, err := s.Drain(); !errors.Is(err, ErrClosed) {
				t.Errorf("Drain after Close: %v", err)
			}
			if err := s.Start(); !errors.Is(err, ErrClosed) {
				t.Errorf("Start after Close: %v", err)
			}
			// Buffered events remain readable; then the channel must end.
			done := make(chan struct{})
			go func() {
				for range s.Events() {
				}
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(time.Second):
				t.Error("Events not closed")
			}
			if got := countFDs(t); got != fds {
				t.Errorf("cycle %d: %d fds open after Close, %d before", cycle, got, fds)
			}
		}
		if !waitFor(time.Second, func() bool { return runtime.NumGoroutine() <= gs }) {
			t.Errorf("%d goroutines after Close, %d before", runtime.NumGoroutine(), gs)
		}
	})
}

// A sampler that is never started must close cleanly too.
func TestCloseWithoutStart(t *testing.T) {
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	fds := countFDs(t)
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Drain(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d fds open after Close, %d before", got, fds)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{SampleRate: -1},
		{MaxStackDepth: 128},
		{MaxStackDepth: -1},
		{Mode: 7},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string]string{
		"0-1\n":       "[0 1]",
		"0":           "[0]",
		"0-2,4,6-7\n": "[0 1 2 4 6 7]",
	} {
		got, err := parseCPUList(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("parseCPUList(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1-"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) succeeded", bad)
		}
	}
}

func TestCheckMessages(t *testing.T) {
	all := uint64(1<<capBPF | 1<<capPerfmon)
	ok := host{capEff: all, release: "6.18.44-fc-v595", paranoid: 2}
	if err := ok.check(); err != nil {
		t.Fatalf("complete host: %v", err)
	}
	for _, tc := range []struct {
		h    host
		want []string
	}{
		{host{capEff: 0, release: "6.1.0", paranoid: 2}, []string{"CAP_BPF and CAP_PERFMON"}},
		{host{capEff: 1 << capBPF, release: "6.1.0", paranoid: 2}, []string{"CAP_PERFMON"}},
		{host{capEff: 1 << capSysAdmin, release: "6.1.0", paranoid: 3}, nil},
		{host{capEff: all, release: "5.10.0-28-amd64", paranoid: 2}, nil},
		{host{capEff: all, release: "5.4.0-1", paranoid: 2, features: []string{"BPF ring buffers (Linux 5.8)"}},
			[]string{"kernel features BPF ring buffers (Linux 5.8) (Linux 5.10 or newer has them all; running 5.4.0-1)"}},
		{host{capEff: all, release: "6.1.0", btfErr: &os.PathError{Op: "open", Path: btfPath, Err: os.ErrNotExist}, paranoid: 2},
			[]string{"kernel BTF /sys/kernel/btf/vmlinux"}},
		{host{capEff: all, release: "6.1.0", paranoid: 3}, []string{"perf_event_paranoid=3 needs CAP_SYS_ADMIN"}},
		{host{capEff: 0, release: "4.19.0", paranoid: 3, features: []string{"x"}}, []string{"CAP_BPF", "kernel features x", "perf_event_paranoid=3"}},
	} {
		err := tc.h.check()
		if tc.want == nil {
			if err != nil {
				t.Errorf("%+v: %v", tc.h, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: no error", tc.h)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") {
			t.Errorf("multi-line message %q", msg)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%+v: %q lacks %q", tc.h, msg, w)
			}
		}
	}
}

// New run without CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN must fail with the one
// line that names them. The child is this test binary under setpriv, with
// those capabilities removed from its bounding set.
func TestNewWithoutCapabilities(t *testing.T) {
	if os.Getenv("PROFSYM_SAMPLER_CHILD") == "nocaps" {
		_, err := New(Config{})
		if err == nil {
			os.Stdout.WriteString("NEW SUCCEEDED\n")
			os.Exit(0)
		}
		os.Stdout.WriteString("ERR: " + err.Error() + "\n")
		os.Exit(0)
	}
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	// The child is this binary run as an unprivileged user: the kernel
	// clears the capabilities of a process that leaves uid 0.
	child := copyTestBinary(t)
	cmd := exec.Command(child, "-test.run=^TestNewWithoutCapabilities$")
	cmd.Dir = filepath.Dir(child)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Env = append(os.Environ(), "PROFSYM_SAMPLER_CHILD=nocaps")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	line := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "ERR: ") || strings.HasPrefix(l, "NEW SUCCEEDED") {
			line = l
		}
	}
	t.Logf("child: %s", line)
	if !strings.Contains(line, "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)") {
		t.Errorf("child said %q, want the missing capabilities named", line)
	}
}

// TestMemlock: without CAP_SYS_RESOURCE and with RLIMIT_MEMLOCK at 8 MiB
// (this project's machines), New succeeds where the kernel charges BPF
// memory to the memory cgroup (5.11+), and elsewhere (5.10) fails with the
// message that says the limit needed. The child is this binary as an
// unprivileged user keeping CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (ambient
// capabilities), not CAP_SYS_RESOURCE.
func TestMemlock(t *testing.T) {
	if os.Getenv("PROFSYM_SAMPLER_CHILD") == "memlock" {
		lim := unix.Rlimit{Cur: 8 << 20, Max: 8 << 20}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			os.Stdout.WriteString("ERR: setrlimit: " + err.Error() + "\n")
			os.Exit(0)
		}
		charged, err := memlockCharged()
		if err != nil {
			os.Stdout.WriteString("ERR: probe: " + err.Error() + "\n")
			os.Exit(0)
		}
		s, err := New(Config{})
		switch {
		case err == nil:
			s.Close()
			fmt.Printf("RESULT charged=%v ok\n", charged)
		default:
			fmt.Printf("RESULT charged=%v err=%v\n", charged, err)
		}
		os.Exit(0)
	}
	testfixture.Short(t, "eBPF")
	if err := CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	child := copyTestBinary(t)
	cmd := exec.Command(child, "-test.run=^TestMemlock$")
	cmd.Dir = filepath.Dir(child)
	caps := []uintptr{capBPF, capPerfmon, capSysAdmin}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, AmbientCaps: caps}
	cmd.Env = append(os.Environ(), "PROFSYM_SAMPLER_CHILD=memlock")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	line := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "RESULT ") || strings.HasPrefix(l, "ERR: ") {
			line = l
		}
	}
	t.Logf("child: %s", line)
	switch {
	case strings.HasPrefix(line, "RESULT charged=false ok"):
	case strings.HasPrefix(line, "RESULT charged=true err="):
		if !strings.Contains(line, "RLIMIT_MEMLOCK") || !strings.Contains(line, "MiB") || !strings.Contains(line, "hard limit is 8 MiB") {
			t.Errorf("the error does not say the limit needed: %s", line)
		}
	default:
		t.Errorf("child: %q (want New to succeed where memory is charged to the cgroup, and a MemlockError elsewhere)", line)
	}
}

// copyTestBinary copies this test binary where an unprivileged user may
// run it (go test's own directory is private).
func copyTestBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sampler-child-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	child := filepath.Join(dir, "sampler.test")
	if err := os.WriteFile(child, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return child
}
