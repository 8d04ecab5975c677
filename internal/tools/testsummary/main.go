// Command testsummary runs `go test -json ...` (its arguments), prints what
// plain `go test` would (package lines, and the output of failing tests),
// then a summary of every skipped test with its reason, so a package whose
// tests all skipped does not pass unseen behind its "ok". It exits with the
// command's status, or 1 if a test failed while the command said 0.
//
//	testsummary go test -json -count=1 ./...
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// event is one line of go test -json (see go doc test2json); build events
// carry ImportPath instead of Package.
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
	Elapsed    float64
}

type skip struct{ pkg, test, reason string }

// timed is a top-level test and its seconds: the slowest are listed, so a
// CI run says where its minutes went.
type timed struct {
	pkg, test string
	secs      float64
}

type summary struct {
	out     io.Writer
	logs    map[string][]string // output so far per package and test
	skips   []skip
	ran     map[string]int // top-level tests run per package
	skipped map[string]int // top-level tests skipped per package
	times   []timed
	failed  bool
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, logs: map[string][]string{}, ran: map[string]int{}, skipped: map[string]int{}}
}

func (s *summary) line(raw string) {
	var e event
	if !strings.HasPrefix(raw, "{") || json.Unmarshal([]byte(raw), &e) != nil {
		fmt.Fprintln(s.out, raw) // not an event: go's own messages
		return
	}
	key := e.Package + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(s.out, e.Output)
	case e.Action == "build-fail":
		s.failed = true
	case e.Test == "" && e.Action == "output":
		if e.Output != "PASS\n" {
			fmt.Fprint(s.out, e.Output)
		}
	case e.Test == "" && e.Action == "fail":
		s.failed = true
	case e.Test == "":
	case e.Action == "output":
		s.logs[key] = append(s.logs[key], e.Output)
	case e.Action == "run" && !strings.Contains(e.Test, "/"):
		s.ran[e.Package]++
	case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
		if !strings.Contains(e.Test, "/") {
			s.times = append(s.times, timed{e.Package, e.Test, e.Elapsed})
		}
		lines := s.logs[key]
		delete(s.logs, key)
		switch e.Action {
		case "fail":
			s.failed = true
			for _, l := range lines {
				if !strings.HasPrefix(l, "=== ") {
					fmt.Fprint(s.out, l)
				}
			}
		case "skip":
			s.skips = append(s.skips, skip{e.Package, e.Test, reason(lines)})
			if !strings.Contains(e.Test, "/") {
				s.skipped[e.Package]++
			}
		}
	}
}

// reason is what a skipped test logged, less go test's own lines.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		r = append(r, t)
	}
	return strings.Join(r, " / ")
}

// slowest is how many of the slowest top-level tests report lists.
const slowest = 12

func (s *summary) report() {
	slices.SortStableFunc(s.times, func(a, b timed) int { return cmp.Compare(b.secs, a.secs) })
	if len(s.times) > 0 {
		fmt.Fprintln(s.out, "\nslowest tests:")
		for _, t := range s.times[:min(slowest, len(s.times))] {
			fmt.Fprintf(s.out, "  %7.1fs %s %s\n", t.secs, t.pkg, t.test)
		}
	}
	if len(s.skips) == 0 {
		fmt.Fprintln(s.out, "\nskipped: none")
		return
	}
	slices.SortFunc(s.skips, func(a, b skip) int {
		return strings.Compare(a.pkg+"\x00"+a.test, b.pkg+"\x00"+b.test)
	})
	fmt.Fprintf(s.out, "\nskipped: %d\n", len(s.skips))
	for _, k := range s.skips {
		fmt.Fprintf(s.out, "  %s %s: %s\n", k.pkg, k.test, k.reason)
	}
	var empty []string
	for pkg, n := range s.ran {
		if s.skipped[pkg] == n {
			empty = append(empty, pkg)
		}
	}
	if len(empty) > 0 {
		slices.Sort(empty)
		fmt.Fprintf(s.out, "packages whose every test skipped: %s\n", strings.Join(empty, " "))
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsummary go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s := newSummary(os.Stdout)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		s.line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		io.Copy(io.Discard, stdout)
	}
	err = cmd.Wait()
	s.report()
	fmt.Printf("testsummary: %v of wall time\n", time.Since(start).Round(time.Second))
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	case s.failed:
		os.Exit(1)
	}
}
