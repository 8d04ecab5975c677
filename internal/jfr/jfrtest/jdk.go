package jfrtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// RecordJDK runs testdata/src/jfr/Hot.java (compiled with javac) under the
// JDK's own flight recorder, settings=profile, for millis milliseconds, and
// returns the recording's path. Recordings are cached per source, JDK and
// duration, like the other fixtures.
func RecordJDK(t testing.TB, millis int) string {
	t.Helper()
	return RecordJDKWith(t, "Hot", millis, "settings=profile")
}

// RecordJDKWith runs testdata/src/jfr/<class>.java for millis milliseconds
// under -XX:StartFlightRecording=<options>,filename=... (options such as
// "settings=profile,jdk.ObjectAllocationInNewTLAB#enabled=true", the
// per-event syntax JDK 17 accepts) and returns the recording's path,
// cached per source, JDK, options and duration.
func RecordJDKWith(t testing.TB, class string, millis int, options string) string {
	t.Helper()
	javac := testfixture.NeedTool(t, "javac")
	java := testfixture.NeedTool(t, "java")
	src := testfixture.Src(t, "jfr/"+class+".java")
	code, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	ver, _ := exec.Command(java, "-version").CombinedOutput()
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d", code, ver, millis)
	if options != "settings=profile" || class != "Hot" { // keep Hot's cache key as it was
		fmt.Fprintf(h, "\x00%s\x00%s", class, options)
	}
	return testfixture.Cached(t, "jfr-"+hex.EncodeToString(h.Sum(nil))[:16], strings.ToLower(class)+".jfr", func(tmp string) {
		testfixture.Run(t, javac, "-d", tmp, src)
		rec := filepath.Join(tmp, strings.ToLower(class)+".jfr")
		cmd := exec.Command(java, "-XX:StartFlightRecording="+options+",filename="+rec, "-cp", tmp, class, fmt.Sprint(millis))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("java: %v\n%s", err, b)
		}
	})
}

// JFRTool returns the JDK's jfr command (skips, or fails under CI=true,
// when it is missing).
func JFRTool(t testing.TB) string {
	t.Helper()
	return testfixture.NeedTool(t, "jfr")
}

// PrintJSON runs `jfr print --json --events TYPES FILE`.
func PrintJSON(t testing.TB, file string, types ...string) []byte {
	t.Helper()
	args := []string{"print", "--json"}
	if len(types) > 0 {
		args = append(args, "--events", strings.Join(types, ","))
	}
	args = append(args, file)
	b, err := exec.Command(JFRTool(t), args...).Output()
	if err != nil {
		t.Fatalf("jfr %v: %v", args, err)
	}
	return b
}
