package cpython

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/testfixture"
)

// Interpreter is one Python of the test matrix: Debian's python3 of each
// runtime chroot (statically linked, stripped, LTO and PGO: the eval loop
// split in two), 3.14 and 3.15 from sid (the only Debian suite with them
// as this is written), and the pyenv builds of the host if it has them
// (3.6 to 3.13, shared libpython with its symbol table: 3.6-3.8, 3.10 and
// 3.12 come only from there).
type Interpreter struct {
	Name   string // "3.11", "3.12-pyenv"
	Minor  int
	Python string // the executable, as the process sees it
	Lib    string // libpython, when the interpreter lives there
	root   func(t testing.TB) string
}

// Root is the file system the interpreter runs in ("/" for the host's).
func (i Interpreter) Root(t testing.TB) string {
	if i.root == nil {
		return "/"
	}
	return i.root(t)
}

// Command runs the interpreter with args.
func (i Interpreter) Command(root string, args ...string) *exec.Cmd {
	if root == "/" {
		return exec.Command(i.Python, args...)
	}
	return testfixture.ChrootCommand(root, append([]string{i.Python}, args...)...)
}

// Copy makes testdata files visible to the interpreter.
func (i Interpreter) Copy(t testing.TB, root string, files ...string) []string {
	if root == "/" {
		return files
	}
	return testfixture.ChrootCopy(t, root, files...)
}

// Code is the file holding the eval loop: its host path and the path
// the process maps.
func (i Interpreter) Code(root string) (host, mapped string) {
	mapped = i.Python
	if i.Lib != "" {
		mapped = i.Lib
	}
	return testfixture.ChrootFile(root, mapped), mapped
}

var pyenvVersion = regexp.MustCompile(`^3\.(\d+)\.\d+$`)

// Interpreters lists the matrix.
func Interpreters() []Interpreter {
	if p, ok := testfixture.VMPython(); ok {
		// One interpreter, in a root prepared for it (test/kernels' VMs).
		return []Interpreter{{
			Name: "3." + strconv.Itoa(p.Minor) + "-" + runtime.GOARCH, Minor: p.Minor, Python: p.Python,
			root: func(testing.TB) string { return p.Root },
		}}
	}
	var out []Interpreter
	for _, c := range testfixture.RuntimeChroots {
		minor, _ := strconv.Atoi(c.Python[2:])
		out = append(out, Interpreter{Name: c.Python, Minor: minor, Python: "/usr/bin/python" + c.Python, root: c.Root})
	}
	out = append(out, Interpreter{
		Name: "3.14", Minor: 14, Python: "/usr/bin/python3.14",
		root: func(t testing.TB) string { return testfixture.InterpreterChroot(t, "python3.14", "sid") },
	})
	out = append(out, Interpreter{
		Name: "3.15", Minor: 15, Python: "/usr/bin/python3.15",
		root: func(t testing.TB) string { return testfixture.InterpreterChroot(t, "python3.15", "sid") },
	})
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".pyenv")
	}
	dirs, _ := os.ReadDir(filepath.Join(root, "versions"))
	for _, d := range dirs {
		m := pyenvVersion.FindStringSubmatch(d.Name())
		if m == nil {
			continue
		}
		minor, _ := strconv.Atoi(m[1])
		if minor < 6 || minor > 15 {
			continue
		}
		dir := filepath.Join(root, "versions", d.Name())
		i := Interpreter{
			Name: "3." + m[1] + "-pyenv", Minor: minor,
			Python: filepath.Join(dir, "bin", "python3."+m[1]),
		}
		for _, abi := range []string{"", "m"} { // 3.7 and older: libpython3.7m
			if lib := filepath.Join(dir, "lib", "libpython3."+m[1]+abi+".so.1.0"); fileExists(lib) {
				i.Lib = lib
			}
		}
		if fileExists(i.Python) {
			out = append(out, i)
		}
	}
	return out
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// EvalRanges returns the ELF address ranges of the eval loop of the
// interpreter file at path (named as the process maps it: name).
func EvalRanges(path, name string) ([][2]uint64, error) {
	f, err := elfx.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, _ := findCandidate(&normalize.Process{Mappings: []normalize.Mapping{{Path: name, File: &normalize.FileInfo{}}}})
	fi := inspect(f, c)
	if fi.err != nil {
		return nil, fi.err
	}
	return [][2]uint64{fi.eval, fi.cold}, nil
}
