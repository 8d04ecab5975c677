package testfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// DebianMirror is where debootstrap fetches packages (PROFSYM_DEBIAN_MIRROR
// overrides it).
func DebianMirror() string {
	if m := os.Getenv("PROFSYM_DEBIAN_MIRROR"); m != "" {
		return m
	}
	return "http://deb.debian.org/debian"
}

// Chroot returns a Debian root file system of suite (bullseye, bookworm,
// trixie, ...) with pkgs installed, built once with debootstrap (a few
// minutes and several hundred MB) and kept in CacheDir()/chroots. Test
// binaries of several packages may ask for the same one at once: a file
// lock makes one of them build it while the others wait.
//
// A process started in it (ChrootCommand) is an ordinary process to the
// sampler; its files are reached through /proc/PID/root like a
// container's.
func Chroot(t testing.TB, suite string, pkgs ...string) string {
	t.Helper()
	Short(t, "a debootstrap chroot")
	NeedTool(t, "debootstrap")
	if os.Geteuid() != 0 {
		SkipOrFail(t, "building a %s chroot needs root", suite)
	}
	pkgs = slices.Sorted(slices.Values(pkgs))
	h := sha256.Sum256([]byte(suite + "\x00" + strings.Join(pkgs, ",") + "\x00" + DebianMirror()))
	name := suite + "-" + hex.EncodeToString(h[:])[:12]
	root := filepath.Join(CacheDir(), "chroots", name)
	CacheOnce(t, root, func(tmp string) {
		start := time.Now()
		args := []string{"--variant=minbase"}
		if len(pkgs) > 0 {
			args = append(args, "--include="+strings.Join(pkgs, ","))
		}
		args = append(args, suite, tmp, DebianMirror())
		cmd := exec.Command("debootstrap", args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			tail := out
			if len(tail) > 4000 {
				tail = tail[len(tail)-4000:]
			}
			t.Fatalf("debootstrap %s: %v\n%s", strings.Join(args, " "), err, tail)
		}
		t.Logf("built the %s chroot with %v in %v", suite, pkgs, time.Since(start).Round(time.Second))
	})
	return root
}

// ChrootCopy copies host files into root under /tmp/profsym-fixtures and
// returns their paths as seen inside the chroot.
func ChrootCopy(t testing.TB, root string, files ...string) []string {
	t.Helper()
	dir := filepath.Join(root, "tmp", "profsym-fixtures")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(dst+".tmp", b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(dst+".tmp", dst); err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.Join("/tmp/profsym-fixtures", filepath.Base(f)))
	}
	return out
}

// ChrootCommand runs argv inside root with its own /proc mounted, in a
// mount namespace of its own so nothing stays mounted. The process keeps
// the pid of the returned command: unshare, chroot and the shell exec into
// each other.
func ChrootCommand(root string, argv ...string) *exec.Cmd {
	script := `mount -t proc proc /proc && exec "$@"`
	args := append([]string{"--mount", "--propagation", "private", "chroot", root, "/bin/sh", "-c", script, "sh"}, argv...)
	cmd := exec.Command("unshare", args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	return cmd
}

// ChrootFile is the host path of a file of the chroot.
func ChrootFile(root, path string) string {
	return filepath.Join(root, filepath.Clean("/"+path))
}

// RuntimeChroot is a Debian release the runtime tests run Java and Python
// in, with the versions it brings.
type RuntimeChroot struct {
	Suite    string
	Packages []string
	Python   string // python3's version there
	JDK      int    // the default JDK's feature release
}

// RuntimeChroots are the releases of the runtime matrix. Tests ask for them
// with exactly these packages so that every package's tests share one
// chroot per release.
var RuntimeChroots = []RuntimeChroot{
	{Suite: "bullseye", Packages: []string{"python3", "openjdk-11-jdk-headless"}, Python: "3.9", JDK: 11},
	{Suite: "bookworm", Packages: []string{"python3", "openjdk-17-jdk-headless"}, Python: "3.11", JDK: 17},
	{Suite: "trixie", Packages: []string{"python3", "openjdk-21-jdk-headless"}, Python: "3.13", JDK: 21},
}

// Root builds (once) and returns the chroot.
func (c RuntimeChroot) Root(t testing.TB) string { return Chroot(t, c.Suite, c.Packages...) }

// NodeChroot is a Debian release whose nodejs keeps V8 in libnode.so.N,
// stripped to its dynamic symbols (the host's node links V8 in and has
// a symbol table).
type NodeChroot struct {
	Suite string
	Node  int // nodejs's major version there
}

// NodeChroots are the Debian Node.js releases the V8 tests run: bookworm's
// 18 (V8 10.2) and sid's 24 (V8 13.6, the LTS line).
var NodeChroots = []NodeChroot{{Suite: "bookworm", Node: 18}, {Suite: "sid", Node: 24}}

// Root builds (once) and returns the chroot.
func (c NodeChroot) Root(t testing.TB) string { return Chroot(t, c.Suite, "nodejs") }

// interpreterPackages are, per interpreter and Debian release, every
// package any test of it needs there (the interpreter and its own sampling
// profiler): each test asks for InterpreterChroot, so the tests of one
// interpreter share one chroot per release, one debootstrap in CI.
var interpreterPackages = map[string]map[string][]string{
	"php": {
		"bookworm": {"php8.2-cli", "php8.2-fpm", "php-excimer"},
		"trixie":   {"php8.4-cli", "php8.4-fpm"},
		"sid":      sidInterpreters,
	},
	"ruby": {
		"bookworm": {"ruby3.1", "ruby-stackprof"},
		"trixie":   {"ruby3.3", "ruby-stackprof"},
		"sid":      sidInterpreters,
	},
	"python3.14": {"sid": sidInterpreters},
	"python3.15": {"sid": {"python3.15"}},
}

// sidInterpreters are sid's interpreters that share one chroot: one
// debootstrap of sid for them all.
var sidInterpreters = []string{"php8.4-cli", "php8.4-fpm", "python3.14", "ruby3.3"}

// InterpreterChroot returns suite's chroot of interp ("php", "ruby",
// "python3.14", "python3.15") with its shared package set.
func InterpreterChroot(t testing.TB, interp, suite string) string {
	t.Helper()
	pkgs, ok := interpreterPackages[interp][suite]
	if !ok {
		t.Fatalf("no %s chroot of %s", interp, suite)
	}
	return Chroot(t, suite, pkgs...)
}
