package testfixture

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// S3Server is a real S3-compatible server (versitygw over a POSIX
// directory) started for one test.
type S3Server struct {
	Endpoint string // host:port, plain http
	Access   string
	Secret   string
	Dir      string // the directory it serves: buckets are folders
	// Conditional is whether it honours conditional writes (If-None-Match,
	// If-Match): versitygw keeps ETags in extended attributes, so only with
	// its metadata store on a file system with user xattrs.
	Conditional bool
}

// S3Options adjusts StartS3S.
type S3Options struct {
	// NoMeta runs versitygw without its metadata store: no ETags, and
	// conditional writes are silently ignored (a server without them).
	NoMeta bool
}

// StartS3 starts versitygw (installed by .ci/run with `go install
// github.com/versity/versitygw/cmd/versitygw@v1.8.0`) on a free loopback
// port with random credentials, and stops it when the test ends. It keeps
// object metadata (and so honours conditional writes) where the test's
// temporary directory supports user extended attributes.
func StartS3(t testing.TB) *S3Server { return StartS3With(t, S3Options{}) }

// StartS3With is StartS3 with options.
func StartS3With(t testing.TB, opt S3Options) *S3Server {
	t.Helper()
	bin, err := exec.LookPath("versitygw")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		p := filepath.Join(string(bytes.TrimSpace(gopath)), "bin", "versitygw")
		if _, serr := os.Stat(p); serr != nil {
			SkipOrFail(t, "versitygw is not installed: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 (.ci/run does)")
		}
		bin = p
	}
	dir := t.TempDir()
	s := &S3Server{Endpoint: fmt.Sprintf("127.0.0.1:%d", FreePort(t)), Access: "profsym" + token(4), Secret: token(16), Dir: dir}
	args := []string{"--port", s.Endpoint, "--access", s.Access, "--secret", s.Secret, "--quiet", "posix"}
	if opt.NoMeta || !userXattrs(dir) {
		args = append(args, "--nometa")
	} else {
		s.Conditional = true
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, append(args, dir)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Endpoint, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw did not listen on %s: %v\n%s", s.Endpoint, err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func token(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
