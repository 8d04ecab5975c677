//go:build linux

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The Python the CPython walker's tests run in a VM: Debian's own
// interpreter for the VM's architecture, unpacked from the archive (the VM
// cannot run debootstrap or apt), with only the packages chain.py needs.
const (
	pythonSuite   = "bookworm"
	pythonVersion = "3.11"
)

var pythonPackages = []string{
	"python" + pythonVersion + "-minimal", "libpython" + pythonVersion + "-minimal", "libpython" + pythonVersion + "-stdlib",
	"libc6", "libgcc-s1", "libexpat1", "zlib1g", "libffi8",
}

// pythonPrune are stdlib folders chain.py does not import, left out of the
// image (each VM boot unpacks the whole initramfs).
var pythonPrune = map[string]bool{
	"test": true, "idlelib": true, "ensurepip": true, "lib2to3": true,
	"pydoc_data": true, "tkinter": true, "turtledemo": true, "config-3.11-aarch64-linux-gnu": true,
	"config-3.11-x86_64-linux-gnu": true, "distutils": true, "unittest": true,
}

// pythonRoot unpacks the Python packages into one root file system.
func pythonRoot(a *apt, cache, arch, busybox string) (string, error) {
	return unpackRoot(a, cache, arch, pythonSuite, "python", pythonPackages, busybox)
}

// unpackRoot unpacks the packages of suite into one root file system
// (cached under cache/name-arch-suite), with the static busybox as its
// /bin/sh and mount: what testfixture's ChrootCommand runs in it before
// the runtime.
func unpackRoot(a *apt, cache, arch, suite, name string, pkgs []string, busybox string) (string, error) {
	var vers []string
	for _, p := range pkgs {
		v, err := a.candidate(p+":"+arch, suite)
		if err != nil {
			return "", err
		}
		vers = append(vers, p+"="+v)
	}
	root := filepath.Join(cache, name+"-"+arch+"-"+suite, hashOf(strings.Join(vers, ",")))
	if _, err := os.Stat(filepath.Join(root, ".done")); err == nil {
		return root, nil
	}
	_ = os.RemoveAll(root)
	for i, p := range pkgs {
		_, ver, _ := strings.Cut(vers[i], "=")
		dir := filepath.Join(cache, "pkgs", p+"-"+arch+"-"+ver)
		if err := a.download(p+":"+arch+"="+ver, dir); err != nil {
			return "", err
		}
		if err := mergeTree(dir, root); err != nil {
			return "", fmt.Errorf("unpacking %s: %w", p, err)
		}
	}
	// A merged /usr (trixie on): the loader is /lib/ld-linux-*.so.1.
	if _, err := os.Lstat(filepath.Join(root, "lib")); os.IsNotExist(err) {
		if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), b, 0o755); err != nil {
		return "", err
	}
	for _, l := range []string{"sh", "mount"} {
		if err := os.Symlink("busybox", filepath.Join(bin, l)); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"proc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	return root, os.WriteFile(filepath.Join(root, ".done"), []byte(strings.Join(vers, "\n")+"\n"), 0o644)
}

// mergeTree copies the files and symlinks of src into dst, leaving out
// documentation and pythonPrune's folders (none of which a JDK has).
func mergeTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == ".done" {
			return nil
		}
		if d.IsDir() {
			if pythonPrune[d.Name()] || rel == "usr/share/doc" || rel == "usr/share/man" || rel == "usr/share/lintian" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		out := filepath.Join(dst, rel)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			_ = os.Remove(out)
			return os.Symlink(target, out)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, fi.Mode().Perm())
	})
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:12]
}

// addTree adds the host folder src to the image at name, symlinks kept.
func (c *cpioWriter) addTree(name, src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(name, rel)
		switch {
		case rel == ".done":
		case d.IsDir():
			c.mkdirAll(dst)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			c.symlink(dst, target)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			c.copyFile(dst, p, uint32(fi.Mode().Perm()))
		}
		return nil
	})
}
