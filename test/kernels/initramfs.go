//go:build linux

package main

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// An initramfs is a newc cpio archive (uncompressed: TCG decompresses
// slowly). Entries are added by their path in the image.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCPIO(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1, dirs: map[string]bool{".": true, "/": true}}
}

func (c *cpioWriter) header(name string, mode, size uint32, nlink uint32) {
	if c.err != nil {
		return
	}
	c.ino++
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0, name)
	c.pad(110 + len(name) + 1)
}

func (c *cpioWriter) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *cpioWriter) mkdirAll(dir string) {
	dir = strings.TrimPrefix(path.Clean(dir), "/")
	if dir == "" || dir == "." || c.dirs[dir] {
		return
	}
	c.mkdirAll(path.Dir(dir))
	c.dirs[dir] = true
	c.header(dir, 0o040755, 0, 2)
}

// file adds data at name with the given permission bits.
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o100000|perm, uint32(len(data)), 1)
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	c.pad(len(data))
}

// copyFile adds the host file src at name, following symlinks.
func (c *cpioWriter) copyFile(name, src string, perm uint32) {
	b, err := os.ReadFile(src)
	if err != nil {
		if c.err == nil {
			c.err = err
		}
		return
	}
	c.file(name, perm, b)
}

func (c *cpioWriter) symlink(name, target string) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o120777, uint32(len(target)), 1)
	if c.err == nil {
		_, c.err = io.WriteString(c.w, target)
	}
	c.pad(len(target))
}

func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 1)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}

// libDirs are where the host keeps each architecture's shared libraries
// (the arm64 ones come with gcc-aarch64-linux-gnu's libc6-arm64-cross),
// and imgLibDir where the image's dynamic linker looks for them.
var (
	libDirs = map[string][]string{
		"amd64": {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64"},
		"arm64": {"/usr/aarch64-linux-gnu/lib", "/usr/lib/gcc-cross/aarch64-linux-gnu/12"},
	}
	imgLibDir = map[string]string{"amd64": "/lib/x86_64-linux-gnu", "arm64": "/lib/aarch64-linux-gnu"}
)

// sharedLibs returns the interpreter and every library the ELF files need,
// transitively, as host paths found in dirs.
func sharedLibs(files []string, dirs []string) (interp string, libs map[string]string, err error) {
	libs = map[string]string{}
	queue := append([]string{}, files...)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		ef, err := elf.Open(f)
		if err != nil {
			continue // a script or data: nothing to resolve
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		needed, _ := ef.ImportedLibraries()
		ef.Close()
		for _, n := range needed {
			if _, ok := libs[n]; ok {
				continue
			}
			found := ""
			for _, d := range dirs {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					found = filepath.Join(d, n)
					break
				}
			}
			if found == "" {
				return "", nil, fmt.Errorf("%s needs %s, in none of %v", f, n, dirs)
			}
			libs[n] = found
			queue = append(queue, found)
		}
	}
	return interp, libs, nil
}

// image is what one architecture's initramfs holds.
type image struct {
	arch     string
	busybox  string            // static busybox for arch
	tests    map[string]string // name in /tests -> host test binary
	fixtures string            // host directory laid out for testfixture.EnvPrebuilt
	python   string            // host root of the Python the CPython tests run (/python), or ""
	java     string            // host root of the JDK the HotSpot tests run (/jdk), or ""
	javaFix  string            // their Java fixtures (/javafix)
	// repo: files of the repository the runtime tests read, by their path
	// in it (testdata/src/..., config/default.yaml, _build/profsym), put
	// under /repo (testfixture.EnvRepo).
	repo   map[string]string
	script string // /init
}

// write builds the initramfs at out.
func (im *image) write(out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	c := newCPIO(f)
	for _, d := range []string{"proc", "sys", "dev", "tmp", "etc", "sys/fs/bpf"} {
		c.mkdirAll(d)
	}
	c.copyFile("bin/busybox", im.busybox, 0o755)
	c.symlink("bin/sh", "busybox")
	c.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/tmp:/bin/sh\n"))
	c.file("init", 0o755, []byte(im.script))
	names := make([]string, 0, len(im.tests))
	for n := range im.tests {
		names = append(names, n)
	}
	sort.Strings(names)
	var elfs []string
	for _, n := range names {
		c.copyFile("tests/"+n, im.tests[n], 0o755)
	}
	err = filepath.Walk(im.fixtures, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(im.fixtures, p)
		c.copyFile("fixtures/"+rel, p, uint32(fi.Mode().Perm()))
		elfs = append(elfs, p)
		return nil
	})
	if err != nil {
		return err
	}
	if im.python != "" {
		if err := c.addTree("python", im.python); err != nil {
			return err
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(im.repo)) {
		c.copyFile(path.Join("repo", rel), im.repo[rel], 0o755)
	}
	if im.java != "" {
		if err := c.addTree("jdk", im.java); err != nil {
			return err
		}
		if err := c.addTree("javafix", im.javaFix); err != nil {
			return err
		}
	}
	interp, libs, err := sharedLibs(elfs, libDirs[im.arch])
	if err != nil {
		return err
	}
	if interp != "" {
		src := ""
		for _, d := range libDirs[im.arch] {
			if _, err := os.Stat(filepath.Join(d, path.Base(interp))); err == nil {
				src = filepath.Join(d, path.Base(interp))
				break
			}
		}
		if src == "" {
			return fmt.Errorf("dynamic linker %s not found in %v", interp, libDirs[im.arch])
		}
		c.copyFile(interp, src, 0o755)
	}
	lnames := make([]string, 0, len(libs))
	for n := range libs {
		lnames = append(lnames, n)
	}
	sort.Strings(lnames)
	for _, n := range lnames {
		c.copyFile(path.Join(imgLibDir[im.arch], n), libs[n], 0o755)
	}
	if err := c.close(); err != nil {
		return err
	}
	return f.Close()
}
