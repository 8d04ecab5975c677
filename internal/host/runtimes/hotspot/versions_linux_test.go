package hotspot_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// testedVersions are the feature releases docs/runtimes.md lists as
// walked and tested; the matrix (jdks) must run each of them.
var testedVersions = []int{8, 11, 17, 21, 25, 26, 27}

// TestJavaVersions checks the matrix against what it claims: every tested
// feature release is in it, each JDK of it is the release it is named
// for (java -version in its root), and docs/runtimes.md's version table
// says the same. TestJavaChains runs each JDK of the matrix, mode by mode,
// and holds it to be attached (no layout refused) with 99% whole.
func TestJavaVersions(t *testing.T) {
	matrix := jdks(t)
	if os.Getenv("HSJDK") == "" {
		for _, v := range testedVersions {
			if !slices.ContainsFunc(matrix, func(j jdk) bool { return j.feature == v }) {
				t.Errorf("JDK %d is tested (testedVersions) but not in the matrix", v)
			}
		}
	}
	docs := docVersions(t)
	for _, v := range testedVersions {
		if docs[v] != "walked" {
			t.Errorf("docs/runtimes.md lists JDK %d as %q, want walked", v, docs[v])
		}
	}
	for _, j := range matrix {
		if got := javaFeature(t, j); got != j.feature {
			t.Errorf("%s: java -version says %d, the matrix %d", j.name, got, j.feature)
		}
	}
}

// javaFeature runs java -version on j and returns its feature release
// ("1.8.0_462" is 8).
func javaFeature(t *testing.T, j jdk) int {
	t.Helper()
	java := "java"
	if j.java != "" {
		java = j.java
	}
	var cmd *exec.Cmd
	if j.root == "" {
		cmd = exec.Command(java, "-version")
	} else {
		cmd = testfixture.ChrootCommand(j.root, java, "-version")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -version: %v\n%s", java, err, out)
	}
	m := regexp.MustCompile(`version "(?:1\.)?(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("%s -version: no version in %q", java, out)
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}

// docVersions reads the HotSpot version table of docs/runtimes.md: the
// layout column ("walked", "accepted ...", "refused ...") of each row
// naming single releases ("| 8 (Debian sid 8u...) |").
func docVersions(t *testing.T) map[int]string {
	t.Helper()
	b, err := os.ReadFile("../../../../docs/runtimes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "| JDK | layout | tested |")
	if !ok {
		t.Fatal("docs/runtimes.md: no HotSpot version table")
	}
	out := map[int]string{}
	row := regexp.MustCompile(`^\| (\d+) \(([^)]*)\) \| ([^|]*) \|`)
	for _, l := range strings.Split(rest, "\n")[2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		if m := row.FindStringSubmatch(l); m != nil {
			v, _ := strconv.Atoi(m[1])
			out[v] = strings.TrimSpace(m[3])
		}
	}
	return out
}
