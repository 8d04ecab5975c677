//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Debian's archive, read with apt through a private configuration under
// the cache directory: the host's own sources and lists stay untouched, and
// one host release can fetch every other's kernels.
const sourcesList = `deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security trixie-security main
`

// listsMaxAge: package lists are refreshed once a day at most; a failed
// refresh keeps working from the cache.
const listsMaxAge = 24 * time.Hour

type apt struct {
	dir  string // cache/apt
	opts []string
}

func newApt(cache string) (*apt, error) {
	a := &apt{dir: filepath.Join(cache, "apt")}
	for _, d := range []string{"lists/partial", "archives/partial"} {
		if err := os.MkdirAll(filepath.Join(a.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	src := filepath.Join(a.dir, "sources.list")
	if err := os.WriteFile(src, []byte(sourcesList), 0o644); err != nil {
		return nil, err
	}
	a.opts = []string{
		"-o", "Dir::Etc::sourcelist=" + src, "-o", "Dir::Etc::sourceparts=/dev/null",
		"-o", "Dir::State::Lists=" + filepath.Join(a.dir, "lists"),
		"-o", "Dir::Cache=" + a.dir, "-o", "Dir::Cache::archives=" + filepath.Join(a.dir, "archives"),
		"-o", "APT::Architectures::=amd64", "-o", "APT::Architectures::=arm64",
		"-o", "Debug::NoLocking=1", "-o", "Acquire::Languages=none",
	}
	return a, nil
}

// update refreshes the package lists when they are older than a day.
func (a *apt) update(logf func(string, ...any)) error {
	stamp := filepath.Join(a.dir, "updated")
	if fi, err := os.Stat(stamp); err == nil && time.Since(fi.ModTime()) < listsMaxAge {
		return nil
	}
	logf("apt-get update (private lists in %s)", a.dir)
	if out, err := a.run("apt-get", "-qq", "update"); err != nil {
		return fmt.Errorf("apt-get update: %v\n%s", err, out)
	}
	return os.WriteFile(stamp, nil, 0o644)
}

func (a *apt) run(tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(tool, append(append([]string{}, a.opts...), args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	return cmd.CombinedOutput()
}

// candidate returns the newest version of pkg (name[:arch]) published in
// suite (its security updates included).
func (a *apt) candidate(pkg, suite string) (string, error) {
	out, err := a.run("apt-cache", "madison", pkg)
	if err != nil {
		return "", fmt.Errorf("apt-cache madison %s: %v\n%s", pkg, err, out)
	}
	var vers []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) < 3 {
			continue
		}
		where := strings.Fields(strings.TrimSpace(f[2]))
		if len(where) >= 2 && (strings.HasPrefix(where[1], suite+"/") || strings.HasPrefix(where[1], suite+"-security/")) {
			vers = append(vers, strings.TrimSpace(f[1]))
		}
	}
	if len(vers) == 0 {
		return "", fmt.Errorf("%s: no version in %s", pkg, suite)
	}
	sort.Slice(vers, func(i, j int) bool {
		return exec.Command("dpkg", "--compare-versions", vers[i], "gt", vers[j]).Run() == nil
	})
	return vers[0], nil
}

// kernelPackage resolves the cloud flavour's metapackage of suite to the
// image package it depends on (linux-image-6.1.0-56-cloud-amd64).
func (a *apt) kernelPackage(arch, suite string) (string, error) {
	meta := "linux-image-cloud-" + arch + ":" + arch
	ver, err := a.candidate(meta, suite)
	if err != nil {
		return "", err
	}
	out, err := a.run("apt-cache", "depends", meta+"="+ver)
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %v\n%s", meta, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if p, ok := strings.CutPrefix(l, "Depends: "); ok && strings.HasPrefix(p, "linux-image-") {
			p, _, _ = strings.Cut(p, ":")
			return p, nil
		}
	}
	return "", fmt.Errorf("%s=%s depends on no linux-image package", meta, ver)
}

// download fetches pkg (name:arch[=version]) and unpacks it into dir
// (dpkg-deb -x), once: dir is the cache entry.
func (a *apt) download(pkg, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "dl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", append(append([]string{}, a.opts...), "-qq", "download", pkg)...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %v\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s: %d files", pkg, len(debs))
	}
	x := filepath.Join(tmp, "x")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], x).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	if err := os.WriteFile(filepath.Join(x, ".done"), []byte(filepath.Base(debs[0])+"\n"), 0o644); err != nil {
		return err
	}
	os.RemoveAll(dir)
	return os.Rename(x, dir)
}

// fetchKernel returns the vmlinuz of the cloud kernel of suite for arch,
// from the cache when the archive has nothing newer (or cannot be asked).
func fetchKernel(a *apt, cache, arch, suite string, logf func(string, ...any)) (string, string, error) {
	pkg, err := a.kernelPackage(arch, suite)
	if err != nil {
		// Offline: the newest cached kernel of this suite and arch will do.
		if k, name := cachedKernel(cache, arch, suite); k != "" {
			logf("%v; using the cached %s", err, name)
			return k, name, nil
		}
		return "", "", err
	}
	dir := filepath.Join(cache, "kernels", suite+"-"+arch, pkg)
	if err := a.download(pkg+":"+arch, dir); err != nil {
		return "", "", err
	}
	imgs, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(imgs) != 1 {
		return "", "", fmt.Errorf("%s: %d kernel images", pkg, len(imgs))
	}
	return imgs[0], pkg, nil
}

func cachedKernel(cache, arch, suite string) (string, string) {
	imgs, _ := filepath.Glob(filepath.Join(cache, "kernels", suite+"-"+arch, "*", "boot", "vmlinuz-*"))
	if len(imgs) == 0 {
		return "", ""
	}
	sort.Strings(imgs)
	k := imgs[len(imgs)-1]
	return k, filepath.Base(filepath.Dir(filepath.Dir(k)))
}
