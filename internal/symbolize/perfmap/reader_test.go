package perfmap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/addrmap"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

func TestReaderOwnProcess(t *testing.T) {
	pid := os.Getpid()
	path := fmt.Sprintf("/tmp/perf-%d.map", pid)
	if err := os.WriteFile(path, []byte("1000 100 first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	r := NewReader("")
	m1, err := r.Map(pid)
	if err != nil {
		t.Fatal(err)
	}
	if name, _, ok := m1.Lookup(0x1010); !ok || name != "first" {
		t.Fatalf("Lookup = %q %v", name, ok)
	}
	// Unchanged file: the cached map comes back.
	if m2, err := r.Map(pid); err != nil || m2 != m1 {
		t.Fatalf("unchanged file reparsed: %p %p %v", m1, m2, err)
	}
	// The JIT appends a line that reuses first's memory.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "1000 80 second with spaces\n")
	f.Close()
	if name, start, ok := r.Lookup(pid, 0x1010); !ok || name != "second with spaces" || start != 0x1000 {
		t.Fatalf("after append: %q %#x %v", name, start, ok)
	}
	if name, _, ok := r.Lookup(pid, 0x1090); !ok || name != "first" {
		t.Fatalf("first's tail: %q %v", name, ok)
	}
	r.Forget(pid)
	if len(r.procs) != 0 {
		t.Fatal("Forget kept the pid")
	}
	os.Remove(path)
	if _, err := r.Map(pid); !errors.Is(err, frame.ErrNotFound) {
		t.Fatalf("missing map: %v", err)
	}
	// A FIFO must neither block nor be read.
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Map(pid); !errors.Is(err, frame.ErrCorruptFile) {
		t.Fatalf("fifo: %v", err)
	}
}

// startInNamespace runs script as pid 1 of new pid and mount namespaces with
// a private tmpfs on /tmp, like a container, and returns its host pid once
// script has printed "ready".
func startInNamespace(t *testing.T, script string) int {
	t.Helper()
	unshare := testfixture.NeedTool(t, "unshare")
	// The shell reads /proc/self/stat itself (no fork), and /proc is still
	// the host's, so it learns its host pid.
	full := "mount -t tmpfs tmpfs /tmp || exit 1; read -r hp rest </proc/self/stat; " + script + "; echo ready $hp; exec sleep 60"
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount", "sh", "-c", full)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		testfixture.SkipOrFail(t, "unshare: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 2 || f[0] != "ready" {
		cmd.Wait()
		testfixture.SkipOrFail(t, "namespace helper: %q %v %s", line, err, stderr.String())
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	// Killing the namespace's init takes every process in it down.
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

func TestReaderContainer(t *testing.T) {
	// The JIT sees itself as pid 1 and writes /tmp/perf-1.map in its own
	// /tmp, which the host sees only through /proc/PID/root.
	pid := startInNamespace(t, `printf '7f0000001000 40 LazyCompile:~handler /srv/app.js:10\n' >/tmp/perf-$$.map`)
	if _, err := os.Stat(fmt.Sprintf("/tmp/perf-%d.map", pid)); err == nil {
		t.Fatal("the map leaked to the host's /tmp")
	}
	r := NewReader("")
	if nspid := r.nsPid(pid); nspid != 1 {
		t.Fatalf("NSpid = %d", nspid)
	}
	name, start, ok := r.Lookup(pid, 0x7f0000001020)
	if !ok || name != "LazyCompile:~handler /srv/app.js:10" || start != 0x7f0000001000 {
		t.Fatalf("Lookup = %q %#x %v", name, start, ok)
	}
}

func TestReaderSymlinkStaysInRoot(t *testing.T) {
	// A hostile container points its map at a host path. Resolved naively
	// through /proc/PID/root, the absolute link would reach the host's file.
	secret := filepath.Join(t.TempDir(), "host-only.map")
	if err := os.WriteFile(secret, []byte("1000 10 HOST_SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pid := startInNamespace(t, "ln -s "+secret+" /tmp/perf-$$.map")
	naivePath := fmt.Sprintf("/proc/%d/root/tmp/perf-1.map", pid)
	if b, err := os.ReadFile(naivePath); err != nil || !strings.Contains(string(b), "HOST_SECRET") {
		t.Fatalf("test premise: naive open of %s = %q, %v", naivePath, b, err)
	}
	r := NewReader("")
	m, err := r.Map(pid)
	if err == nil {
		name, _, _ := m.Lookup(0x1000)
		t.Fatalf("read the host's file through a container symlink: %q", name)
	}
	if !errors.Is(err, frame.ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
}

// TestJavaPerfMap runs a real JVM, asks it for its perf map with jcmd
// Compiler.perfmap (JDK 17+), and finds the JIT-compiled hot method.
func TestJavaPerfMap(t *testing.T) {
	javac := testfixture.NeedTool(t, "javac")
	java := testfixture.NeedTool(t, "java")
	jcmd := testfixture.NeedTool(t, "jcmd")
	classes := t.TempDir()
	testfixture.Run(t, javac, "-d", classes, testfixture.Src(t, "perfmap/Hot.java"))

	// The context only bounds a hung run; the cleanup below ends the JVM
	// gently first, so it is cancelled after that, not on return.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, java,
		"-XX:+UnlockDiagnosticVMOptions", "-XX:+PreserveFramePointer",
		"-Xmx64m", "-XX:CICompilerCount=2", "-cp", classes, "Hot", "90")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	mapPath := fmt.Sprintf("/tmp/perf-%d.map", pid)
	t.Cleanup(func() {
		// SIGTERM lets the JVM remove its attach socket and hsperfdata.
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		os.Remove(mapPath)
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "started" {
		t.Fatalf("java: %q %v\n%s", line, err, stderr.String())
	}

	r := NewReader("")
	var (
		m        *Map
		hotAddr  uint64
		hotStart uint64
		hotName  string
		jcmdOut  string
	)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second) // let the JIT compile spin
		b, err := exec.CommandContext(ctx, jcmd, strconv.Itoa(pid), "Compiler.perfmap").CombinedOutput()
		jcmdOut = string(b)
		if err != nil {
			t.Fatalf("jcmd %d Compiler.perfmap: %v\n%s", pid, err, b)
		}
		if m, err = r.Map(pid); err != nil {
			t.Fatal(err)
		}
		// Take an address the hot method owns after last-writer-wins, the
		// middle of one of its stretches, so reused code cache memory
		// cannot make the check flaky.
		for i := range m.segStart {
			s := m.segSym[i]
			if name := m.names[m.nameOff[s]:m.nameOff[s+1]]; strings.Contains(name, "Hot.spin(") {
				hotAddr, hotStart, hotName = m.segStart[i]+(m.segEnd[i]-m.segStart[i])/2, m.symStart[s], name
				break
			}
		}
		if hotName != "" {
			break
		}
	}
	if hotName == "" {
		t.Fatalf("no Hot.spin in the perf map after 60 s (%d symbols); jcmd said:\n%s", m.Len(), jcmdOut)
	}
	name, start, ok := m.Lookup(hotAddr)
	if !ok || name != hotName || start != hotStart || start > hotAddr {
		t.Fatalf("Lookup(%#x) = %q %#x %v", hotAddr, name, start, ok)
	}
	// The code must be in an executable mapping of the JVM (its code cache).
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	var executable bool
	addrmap.ParseMaps(maps, func(mp addrmap.Mapping) error {
		if mp.Start <= hotAddr && hotAddr < mp.End {
			executable = mp.Perms&addrmap.Exec != 0
		}
		return nil
	})
	if !executable {
		t.Errorf("%q at %#x is not in an executable mapping", hotName, hotAddr)
	}
	names := map[string]bool{}
	for _, n := range m.Symbols() {
		names[n] = true
	}
	t.Logf("pid %d: %d symbols (%d lines skipped); %#x is in %q starting at %#x; Interpreter listed: %v",
		pid, m.Len(), m.Skipped(), hotAddr, hotName, hotStart, names["Interpreter"])
}

func TestReaderConcurrent(t *testing.T) {
	pid := os.Getpid()
	path := fmt.Sprintf("/tmp/perf-%d.map", pid)
	if err := os.WriteFile(path, []byte("1000 100 f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	r := NewReader("")
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 100; i++ {
				if name, _, ok := r.Lookup(pid, 0x1001); !ok || name != "f" {
					t.Errorf("Lookup = %q %v", name, ok)
					return
				}
				if i%10 == 0 {
					r.Forget(pid)
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}
