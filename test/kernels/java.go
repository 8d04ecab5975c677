//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The JDK the HotSpot walker's tests run in a VM: Debian's own OpenJDK for
// the VM's architecture, unpacked from the archive with the libraries
// java loads, as the Python of python.go.
const (
	javaSuite   = "trixie"
	javaFeature = 21
)

var javaPackages = []string{
	fmt.Sprintf("openjdk-%d-jre-headless", javaFeature), "libc6", "libgcc-s1", "libstdc++6", "zlib1g",
}

// javaRoot unpacks the JDK's packages into one root file system.
func javaRoot(a *apt, cache, arch, busybox string) (string, error) {
	return unpackRoot(a, cache, arch, javaSuite, "java", javaPackages, busybox)
}

// javaBin is the java binary of the JDK as the VM's process sees it.
func javaBin(arch string) string {
	return fmt.Sprintf("/usr/lib/jvm/java-%d-openjdk-%s/bin/java", javaFeature, arch)
}

// javaFixtures compiles the HotSpot tests' Java fixtures with the host's
// JDK (--release 8: any JDK runs them) into dir: fixture.jar and javap's
// listing of fixture.Chain, which the tests read their lines from
// (internal/host/runtimes/hotspot), and the end-to-end tests' JChain
// classes in jchain/ (testfixture.VMJDK).
func javaFixtures(root, dir string) error {
	src := filepath.Join(root, "testdata/src/runtimes/java/fixture")
	srcs, _ := filepath.Glob(filepath.Join(src, "*.java"))
	if len(srcs) == 0 {
		return fmt.Errorf("no Java sources in %s", src)
	}
	_ = os.RemoveAll(dir)
	classes := filepath.Join(dir, "classes")
	if err := runCmd(root, os.Environ(), "javac", append([]string{"--release", "8", "-d", classes}, srcs...)...); err != nil {
		return err
	}
	jar := filepath.Join(dir, "fixture.jar")
	if err := runCmd(root, os.Environ(), "jar", "cf", jar, "-C", classes, "."); err != nil {
		return err
	}
	out, err := exec.Command("javap", "-c", "-l", "-cp", jar, "fixture.Chain").Output()
	if err != nil {
		return fmt.Errorf("javap: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "javap-fixture.Chain.txt"), out, 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(classes); err != nil {
		return err
	}
	// The end-to-end tests' JChain, as classes (internal/e2e, javaClasses).
	return runCmd(root, os.Environ(), "javac", "--release", "8", "-d", filepath.Join(dir, "jchain"), filepath.Join(root, "testdata/src/e2e/JChain.java"))
}

// javaEnv is what the VM's init script exports for the HotSpot tests.
func javaEnv(arch string) string {
	return strings.Join([]string{
		"PROFSYM_JAVA_ROOT=/jdk", "PROFSYM_JAVA=" + javaBin(arch),
		fmt.Sprintf("PROFSYM_JAVA_FEATURE=%d", javaFeature), "PROFSYM_JAVA_FIXTURES=/javafix",
	}, " ")
}
