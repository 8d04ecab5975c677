package hotspot_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// testedVersions are the feature releases docs/runtimes.md lists as
// walked and tested; the matrix (jdks) must run each of them.
var testedVersions = []int{8, 11, 17, 21, 25, 26, 27}

// TestJavaVersions checks the matrix against what it claims: every tested
// feature release is in it, each JDK of it is the release it is named
// for (java -version in its root), docs/runtimes.md's version table says
// the same, and each JDK is attached (no layout refused) with 99% of a
// short default (C2) run of fixture.Chain whole. TestJavaChains is the
// thorough check, mode by mode; this one keeps the list honest.
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
	h := newHarness(t, sampler.Config{Runtimes: runtimes.Config{HotSpot: true}})
	jar, lib := javaFixtures(t)
	lines, calls := javapLines(t, jar, "fixture.Chain")
	for _, j := range matrix {
		t.Run(j.name, func(t *testing.T) {
			if got := javaFeature(t, j); got != j.feature {
				t.Fatalf("java -version says %d, the matrix %d", got, j.feature)
			}
			c := chainCheck{want: []string{"hot", "b", "a", "main"}, lines: lines, calls: calls, lib: lib, hotShare: 25}
			cmd := javaCmd(t, j, jar, lib, nil, "fixture.Chain", "chain", "20")
			// At least 200 samples: one at a compilation's transition
			// (JDK 11 once had one of 135) must not cost the 99%.
			h.sampleJVMAtLeast(t, cmd, 6*time.Second, 4*time.Second, 200, false, func(pid int, samples []sampler.Sample) {
				// The fixture's JVM itself: the machine-wide count of
				// refusals also counts other JVMs the sampler meets (a
				// java -version, another package's tests), half set up
				// or exiting (CI: "JDK 11 refused (1 failures)" with
				// the fixture's 389 of 389 samples whole).
				if h.s.Runtimes().Refused(pid) {
					t.Errorf("JDK %d refused", j.feature)
				}
				p, err := h.norm.Refresh(pid)
				if err != nil {
					t.Fatal(err)
				}
				c.run(t, h, p, samples, false)
			})
		})
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
