package runtimes_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/runtimes/cpython"
	"github.com/profsym/profsym/internal/host/runtimes/perl"
	"github.com/profsym/profsym/internal/host/runtimes/php"
	"github.com/profsym/profsym/internal/host/runtimes/ruby"
	"github.com/profsym/profsym/internal/testfixture"
)

// walkerMap is a walker's process map as the host writes it.
type walkerMap map[any]any

func (w walkerMap) Put(k, v any) error { w[k] = v; return nil }
func (w walkerMap) Delete(k any) error { delete(w, k); return nil }

// TestAttachWhileLoading attaches to interpreters at every system call
// they make (stopped by ptrace) from the moment their file's code is
// mapped until they run. Until the loader has mapped a file's data segment
// in its place and relocated it, the interpreter's tables read as
// something else (ld.so maps a library's whole span from its first
// segment before it maps the others over it; pointers hold link-time
// addresses until relocated): a CI run once refused pyenv's 3.12 for good
// on that ("no member co_firstlineno"), read between two of ld.so's mmaps.
// At no stop may a process be refused, and it is attached once it runs.
func TestAttachWhileLoading(t *testing.T) {
	if os.Getuid() != 0 {
		testfixture.SkipOrFail(t, "needs root to trace and read other processes")
	}
	type tcase struct {
		name string
		file string // the mapped file the runtime reads, by the end of its path
		cmd  func(t *testing.T) *exec.Cmd
		rt   func(w walkerMap) runtimes.Runtime
	}
	host := func(argv ...string) func(*testing.T) *exec.Cmd {
		return func(*testing.T) *exec.Cmd { return exec.Command(argv[0], argv[1:]...) }
	}
	chroot := func(interp, suite string, argv ...string) func(*testing.T) *exec.Cmd {
		return func(t *testing.T) *exec.Cmd {
			return testfixture.ChrootCommand(testfixture.InterpreterChroot(t, interp, suite), argv...)
		}
	}
	py := func(w walkerMap) runtimes.Runtime { return cpython.New(cpython.Options{Procs: w}) }
	pyLoop := "import time\nwhile True: time.sleep(0.01)"
	cases := []tcase{
		// Debian's python3.11 is not PIE, but has its GOT relocated.
		{"python3.11", "/usr/bin/python3.11", host("/usr/bin/python3.11", "-c", pyLoop), py},
		{
			"perl5.36", "/usr/bin/perl", host("/usr/bin/perl", "-e", "while (1) { select(undef, undef, undef, 0.01) }"),
			func(w walkerMap) runtimes.Runtime { return perl.New(perl.Options{Procs: w}) },
		},
		{
			"ruby3.1-bookworm", "/libruby-3.1.so.3.1.2",
			chroot("ruby", "bookworm", "ruby3.1", "--disable-gems", "-e", "loop { sleep 0.01 }"),
			func(w walkerMap) runtimes.Runtime { return ruby.New(ruby.Options{Procs: w}) },
		},
		{
			"php8.2-bookworm", "/usr/bin/php8.2",
			chroot("php", "bookworm", "php8.2", "-n", "-r", "while (true) usleep(10000);"),
			func(w walkerMap) runtimes.Runtime { return php.New(php.Options{Procs: w}) },
		},
	}
	home, _ := os.UserHomeDir()
	libs, _ := filepath.Glob(filepath.Join(home, ".pyenv", "versions", "3.1[1-3].*", "lib", "libpython3.1[1-3].so.1.0"))
	for _, lib := range libs {
		dir := filepath.Dir(filepath.Dir(lib))
		minor := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(lib), "libpython"), ".so.1.0")
		cases = append(cases, tcase{
			minor + "-pyenv", "/" + filepath.Base(lib),
			host(filepath.Join(dir, "bin", "python"+minor), "-c", pyLoop), py,
		})
	}
	if len(libs) == 0 && os.Getenv("CI") == "true" {
		t.Fatal("no pyenv libpython3.11 to 3.13: .ci/run installs them")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			walker := walkerMap{}
			r := c.rt(walker)
			n := normalize.New(normalize.Options{})
			var stops, looked, loading, starting int
			cmd := c.cmd(t)
			traceUntil(t, cmd, func(pid int) bool {
				stops++
				if !mapsCode(t, pid, c.file) {
					return false
				}
				looked++
				p, err := n.Refresh(pid)
				if err != nil {
					t.Fatal(err)
				}
				// Each stop is a first look: how many tries a process gets
				// before it is refused is not what is tested.
				r.Forget(pid)
				_, found, err := r.Attach(p)
				if !found || err != nil {
					t.Fatalf("stop %d: found %v, err %v; want not ready, or attached", stops, found, err)
				}
				if len(walker) > 0 {
					return true
				}
				if m := fileMapping(p, c.file); m == nil || runtimes.Loaded("", pid, m) != nil {
					loading++
				} else {
					starting++
				}
				return false
			})
			t.Logf("%d stops, %d with the file's code mapped: not ready at %d while loading, %d while starting",
				stops, looked, loading, starting)
			if loading == 0 {
				t.Error("no stop while the loader had the file: the test missed what it tests")
			}
		})
	}
}

func fileMapping(p *normalize.Process, suffix string) *normalize.Mapping {
	for i := range p.Mappings {
		if strings.HasSuffix(p.Mappings[i].Path, suffix) {
			return &p.Mappings[i]
		}
	}
	return nil
}

// traceUntil starts cmd under ptrace and calls at with it stopped at each
// system call (entry and exit, through its execs) until at says done.
func traceUntil(t *testing.T, cmd *exec.Cmd, at func(pid int) bool) {
	// ptrace requests come from the thread that traces.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	start := time.Now()
	var ws syscall.WaitStatus
	for stops := 0; ; stops++ {
		if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != nil {
			t.Fatal(err)
		}
		if !ws.Stopped() {
			t.Fatalf("ended: %v", ws)
		}
		if at(pid) {
			return
		}
		// An interpreter starts in a few hundred system calls; then it
		// sleeps 10 ms a loop.
		if stops > 20000 || time.Since(start) > time.Minute {
			t.Fatalf("not done after %d stops, %v", stops, time.Since(start))
		}
		// A signal stop passes its signal on (SIGCHLD from sh's mount).
		sig := 0
		if s := ws.StopSignal(); s != syscall.SIGTRAP {
			sig = int(s)
		}
		if err := syscall.PtraceSyscall(pid, sig); err != nil {
			t.Fatal(err)
		}
	}
}

// mapsCode reports whether pid maps code of a file whose path ends in
// suffix.
func mapsCode(t *testing.T, pid int, suffix string) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 6 && strings.HasSuffix(fs[5], suffix) && strings.HasPrefix(fs[1], "r-x") {
			return true
		}
	}
	return false
}
