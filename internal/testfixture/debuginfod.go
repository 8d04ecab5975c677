package testfixture

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Debuginfod is a real elfutils debuginfod server indexing one folder.
type Debuginfod struct {
	URL  string
	cmd  *exec.Cmd
	once sync.Once
}

// Stop kills the server (idempotent).
func (s *Debuginfod) Stop() {
	s.once.Do(func() {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	})
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	// The port is free only until someone binds it: the kernel may hand a
	// closed port to the next bind(0) at once, so two calls before their
	// servers start could get the same one. Never hand a port out twice.
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !portsGiven[port] {
			portsGiven[port] = true
			return port
		}
	}
	t.Fatal("no free port not handed out before")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// StartDebuginfod starts debuginfod over dir on loopback and waits until
// each "BUILDID/debuginfo" or "BUILDID/executable" in ready is served.
func StartDebuginfod(t testing.TB, dir string, ready ...string) *Debuginfod {
	t.Helper()
	bin := NeedTool(t, "debuginfod")
	work := t.TempDir()
	var lastErr error
	for try := 0; try < 3; try++ { // the port can be taken before the server binds it
		port := FreePort(t)
		logPath := filepath.Join(work, fmt.Sprintf("log%d", try))
		log, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-p", strconv.Itoa(port), "-d", filepath.Join(work, fmt.Sprintf("db%d.sqlite", try)),
			"-F", "-t", "0", "-g", "0", "-c", "1", dir)
		// No upstream: an inherited DEBUGINFOD_URLS would make it federate.
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "DEBUGINFOD_URLS=") {
				env = append(env, kv)
			}
		}
		cmd.Env = append(env, "DEBUGINFOD_URLS=")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		log.Close()
		s := &Debuginfod{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
		t.Cleanup(s.Stop)
		if lastErr = waitServed(s.URL, ready, 60*time.Second); lastErr == nil {
			return s
		}
		s.Stop()
		b, _ := os.ReadFile(logPath)
		lastErr = fmt.Errorf("%v\nlog:\n%s", lastErr, b)
	}
	t.Fatalf("debuginfod did not come up: %v", lastErr)
	return nil
}

func waitServed(base string, ready []string, limit time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	get := func(u string) int {
		resp, err := hc.Get(u)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for get(base+"/metrics") != http.StatusOK {
		if time.Now().After(deadline) {
			return errors.New("/metrics never answered")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range ready {
		for get(base+"/buildid/"+r) != http.StatusOK {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s never indexed", r)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}
