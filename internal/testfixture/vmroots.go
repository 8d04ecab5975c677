package testfixture

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Runtimes and sources for machines with no chroots, no JDK to build with
// and no repository (test/kernels' VMs): the host unpacks Debian's
// interpreter of the VM's architecture into a root file system, builds the
// Java fixtures and copies what the tests read, and these variables say
// where. Each replaces its test matrix with that one runtime.
const (
	// EnvRepo names a folder that stands for the repository: Root returns
	// it (config/, testdata/src/ and _build/ as far as the tests read them).
	EnvRepo = "PROFSYM_REPO"
	// EnvPythonRoot and EnvPython: a root holding one Python (run in it as
	// in a chroot) and its path there (/usr/bin/python3.11).
	EnvPythonRoot = "PROFSYM_PYTHON_ROOT"
	EnvPython     = "PROFSYM_PYTHON"
	// EnvJavaRoot, EnvJava and EnvJavaFeature: a root holding one JDK, its
	// java there and its feature release. EnvJavaFixtures: the Java
	// fixtures built on the host (JavaFixtures).
	EnvJavaRoot     = "PROFSYM_JAVA_ROOT"
	EnvJava         = "PROFSYM_JAVA"
	EnvJavaFeature  = "PROFSYM_JAVA_FEATURE"
	EnvJavaFixtures = "PROFSYM_JAVA_FIXTURES"
)

// PreparedPython is the Python EnvPythonRoot names.
type PreparedPython struct {
	Root, Python string
	Minor        int // 11 for python3.11
}

// VMPython returns the prepared Python, if the variables name one.
func VMPython() (PreparedPython, bool) {
	root := os.Getenv(EnvPythonRoot)
	if root == "" {
		return PreparedPython{}, false
	}
	py := os.Getenv(EnvPython)
	minor, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(py), "python3."))
	return PreparedPython{Root: root, Python: py, Minor: minor}, true
}

// PreparedJDK is the JDK EnvJavaRoot names.
type PreparedJDK struct {
	Root, Java string
	Feature    int
	// Fixtures holds the hotspot package's fixture.jar and javap's listing
	// of each of its classes (javap-CLASS.txt), and, under jchain/, the
	// end-to-end tests' JChain classes. No JNI library: the modes that need
	// one are left out.
	Fixtures string
}

// VMJDK returns the prepared JDK, if the variables name one.
func VMJDK() (PreparedJDK, bool) {
	root := os.Getenv(EnvJavaRoot)
	if root == "" {
		return PreparedJDK{}, false
	}
	feature, _ := strconv.Atoi(os.Getenv(EnvJavaFeature))
	return PreparedJDK{Root: root, Java: os.Getenv(EnvJava), Feature: feature, Fixtures: os.Getenv(EnvJavaFixtures)}, true
}
