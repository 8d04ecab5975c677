package hotspot_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// compiled is a method whose compile a test waits for before it samples:
// the state the mode is about (C1's or C2's code, the inlining asked),
// reached when the JIT says so, not after a guessed warm-up that a loaded
// machine outlasts (JDK 8's C2 had not compiled a 6 s into a CI run).
type compiled struct {
	method string // as -XX:+PrintCompilation names it: fixture.Chain::a
	// level is the tier, 1 to 4; 0 where the JVM runs C2 alone
	// (-XX:-TieredCompilation), which prints no tier.
	level int
	osr   bool // an on-stack replacement of a loop counts too
}

func (c compiled) String() string {
	s := fmt.Sprintf("%s at tier %d", c.method, c.level)
	if c.osr {
		s += " (or OSR)"
	}
	return s
}

// jitWatch reads a JVM's -XX:+PrintCompilation output and closes ready
// once each wanted method has been compiled as asked, or, for a program
// that says when it is set up (TestHostileProcess's), once it wrote line.
// The program's other lines go to the test's stderr; done is closed once
// all are read.
type jitWatch struct {
	ready chan struct{}
	want  []compiled
	line  string
	// stderr: the watch reads the program's stderr, where
	// -XX:+DisplayVMOutputToStderr sends the JIT's lines (on stdout they
	// were written into the middle of the program's own lines).
	stderr bool
	done   chan struct{}
	wr     *os.File // the pipe's write end until the program has its own
	mu     sync.Mutex
	seen   []string // the fixture's compiles so far, for a failure's message
}

func (w *jitWatch) String() string {
	var parts []string
	for _, c := range w.want {
		parts = append(parts, c.String())
	}
	if w.line != "" {
		parts = append(parts, fmt.Sprintf("a line %q", w.line))
	}
	return strings.Join(parts, ", ")
}

// watchLine waits for a line of the program's stdout.
func watchLine(line string) *jitWatch {
	return &jitWatch{ready: make(chan struct{}), line: line}
}

// watchJIT adds -XX:+PrintCompilation to jvmArgs and returns them with the
// watch; start it on the command with attach.
func watchJIT(jvmArgs []string, want []compiled) ([]string, *jitWatch) {
	return append(jvmArgs[:len(jvmArgs):len(jvmArgs)], "-XX:+PrintCompilation", "-XX:+DisplayVMOutputToStderr"),
		&jitWatch{ready: make(chan struct{}), want: want, stderr: true}
}

// attach takes cmd's stdout (stderr for the JIT's lines), before cmd
// starts; started must follow the start. The compiles of the JVM's own
// methods (hundreds) are dropped. A pipe of our own, not StdoutPipe: Wait
// would close that before the last lines were read.
func (w *jitWatch) attach(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stderr {
		cmd.Stderr = wr
	} else {
		cmd.Stdout = wr
	}
	w.wr, w.done = wr, make(chan struct{})
	go func() {
		defer close(w.done)
		defer r.Close()
		w.read(r)
	}()
}

// started closes our copy of the write end: the reader ends when the
// program does (or now, if it did not start).
func (w *jitWatch) started() { _ = w.wr.Close() }

// wait waits until the program's output is all read.
func (w *jitWatch) wait() { <-w.done }

func (w *jitWatch) read(r io.Reader) {
	done := make([]bool, len(w.want))
	left := len(w.want)
	lineLeft := w.line != ""
	if lineLeft {
		left++
	}
	if left == 0 {
		close(w.ready)
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if lineLeft && line == w.line {
			lineLeft = false
			if left--; left == 0 {
				close(w.ready)
			}
			continue
		}
		method, level, osr, ok := parseCompile(line)
		if !ok {
			fmt.Fprintln(os.Stderr, line)
			continue
		}
		if !strings.HasPrefix(method, "fixture.") {
			continue
		}
		w.mu.Lock()
		w.seen = append(w.seen, strings.Join(strings.Fields(line), " "))
		w.mu.Unlock()
		if strings.Contains(line, "made not entrant") || strings.Contains(line, "made zombie") {
			continue
		}
		for i, c := range w.want {
			if !done[i] && method == c.method && level == c.level && (!osr || c.osr) {
				done[i] = true
				if left--; left == 0 {
					close(w.ready)
				}
			}
		}
	}
}

// compiles lists the fixture's compiles seen so far.
func (w *jitWatch) compiles() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.seen, "; ")
}

// parseCompile reads one line of -XX:+PrintCompilation, the same from JDK 8
// to 27: milliseconds, compile id, flag characters (% for OSR), the tier
// where tiered compilation is on (- for none), then the method, as in
//
//	26    8 %     4       fixture.Chain::hot @ 5 (37 bytes)
//	1140    7             fixture.Chain::a (22 bytes)   made not entrant
func parseCompile(line string) (method string, level int, osr, ok bool) {
	f := strings.Fields(line)
	at := -1
	for i, s := range f {
		if strings.Contains(s, "::") {
			at = i
			break
		}
	}
	if at < 2 {
		return "", 0, false, false
	}
	for _, s := range f[:2] {
		if strings.TrimLeft(s, "0123456789") != "" {
			return "", 0, false, false
		}
	}
	for _, s := range f[2:at] {
		switch {
		case strings.ContainsRune(s, '%'): // with s, !, b or n beside it at times
			osr = true
		case len(s) == 1 && s[0] >= '1' && s[0] <= '4':
			level = int(s[0] - '0')
		}
	}
	return f[at], level, osr, true
}

func TestParseCompile(t *testing.T) {
	for _, c := range []struct {
		line   string
		method string
		level  int
		osr    bool
		ok     bool
	}{
		{"     26    8 %     4       fixture.Chain::hot @ 5 (37 bytes)", "fixture.Chain::hot", 4, true, true},
		{"    913   15       4       fixture.Chain::a (22 bytes)", "fixture.Chain::a", 4, false, true},
		{"   1140    7             fixture.Chain::a (22 bytes)", "fixture.Chain::a", 0, false, true},
		{"     25    2 %           fixture.Chain::hot @ 5 (37 bytes)   made not entrant", "fixture.Chain::hot", 0, true, true},
		{"    300   41 %s!b  3       java.lang.Object::wait @ 2 (12 bytes)", "java.lang.Object::wait", 3, true, true},
		{"    301   42  s    -       java.lang.Object::notify (native)", "java.lang.Object::notify", 0, false, true},
		{"go 1700000000", "", 0, false, false},
		{"Exception in thread main: fixture.Chain::hot", "", 0, false, false},
	} {
		method, level, osr, ok := parseCompile(c.line)
		if method != c.method || level != c.level || osr != c.osr || ok != c.ok {
			t.Errorf("%q: %q tier %d osr %v ok %v, want %q %d %v %v", c.line, method, level, osr, ok, c.method, c.level, c.osr, c.ok)
		}
	}
}
