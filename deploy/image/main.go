// Command image writes the otelcol-profsym container image (`make image`)
// as an OCI archive, for every architecture at once, from binaries built on
// this machine: no base image, no container engine, no network. The same
// inputs give the same bytes, so the same digests.
//
// The image holds:
//
//	/otelcol-profsym                      the distribution (entrypoint), static
//	/profsym                              the CLI (top, convert, upload, ...), static
//	/etc/ssl/certs/ca-certificates.crt    for debuginfod servers, S3 and OTLP backends over TLS
//	/etc/nsswitch.conf                    hosts: files dns (Go's resolver reads /etc/hosts first)
//	/etc/passwd, /etc/group               root and the unprivileged user 10001 the chart runs as
//	/tmp                                  1777, for runs without a mounted /tmp
//
// Usage:
//
//	go run ./deploy/image -o out.oci.tar -ref profsym/otelcol-profsym:0.1.0 \
//	  -arch amd64=_build/image/amd64 -arch arm64=_build/image/arm64
//
// where each directory holds otelcol-profsym and profsym for that
// architecture.
package main

import (
	"bufio"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// binaries are copied from each -arch directory.
var binaries = []string{"otelcol-profsym", "profsym"}

// user is the image's default user: the chart's gateway and symbol store
// run as it; the agent runs as root with added capabilities.
const user = "10001:10001"

type archFlags []string

func (a *archFlags) String() string     { return strings.Join(*a, ",") }
func (a *archFlags) Set(v string) error { *a = append(*a, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	out := fs.String("o", "", "OCI archive to write")
	ref := fs.String("ref", "", "image reference index.json names (repository:tag)")
	version := fs.String("version", "", "org.opencontainers.image.version label")
	source := fs.String("source", "https://github.com/profsym/profsym", "org.opencontainers.image.source label")
	revision := fs.String("revision", "", "org.opencontainers.image.revision label (the commit)")
	createdUnix := fs.Int64("created", 0, "creation time, Unix seconds (the commit's time: the same commit gives the same image)")
	caCerts := fs.String("ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to copy in")
	var arches archFlags
	fs.Var(&arches, "arch", "ARCH=DIR: the binaries of one architecture (repeatable; amd64, arm64)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" || len(arches) == 0 {
		fs.Usage()
		return errors.New("-o, -ref and -arch are required")
	}
	if err := checkCerts(*caCerts); err != nil {
		return err
	}
	s := spec{
		ref:     *ref,
		created: time.Unix(*createdUnix, 0).UTC(),
		user:    user,
		env:     []string{"PATH=/"},
		entry:   []string{"/otelcol-profsym"},
		labels: map[string]string{
			"org.opencontainers.image.title":       "otelcol-profsym",
			"org.opencontainers.image.description": "OpenTelemetry Collector distribution for continuous profiling with symbolization",
			"org.opencontainers.image.source":      *source,
			"org.opencontainers.image.version":     *version,
			"org.opencontainers.image.revision":    *revision,
		},
	}
	for _, a := range arches {
		arch, dir, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("-arch %q: want ARCH=DIR", a)
		}
		p, err := platformFor(arch, dir, *caCerts)
		if err != nil {
			return err
		}
		s.platforms = append(s.platforms, p)
	}
	blobs, index, err := build(s)
	if err != nil {
		return err
	}
	tmp := *out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := writeArchive(w, blobs, index, s.created); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, *out)
}

// platformFor lists one architecture's files, checking that each binary
// is a static ELF executable of that architecture: a scratch image has no
// dynamic loader or libc.
func platformFor(arch, dir, caCerts string) (platform, error) {
	p := platform{arch: arch}
	switch arch {
	case "amd64":
	case "arm64":
		p.variant = "v8"
	default:
		return p, fmt.Errorf("architecture %q: amd64 or arm64", arch)
	}
	for _, b := range binaries {
		src := filepath.Join(dir, b)
		if err := checkStatic(src, arch); err != nil {
			return p, err
		}
		p.files = append(p.files, entry{path: "/" + b, mode: 0o755, src: src})
	}
	p.files = append(p.files,
		entry{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, src: caCerts},
		entry{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		entry{path: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nprofsym:x:10001:10001:profsym:/tmp:/sbin/nologin\n")},
		entry{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nprofsym:x:10001:\n")},
		entry{path: "/tmp", mode: 0o1777, dir: true},
	)
	return p, nil
}

// checkCerts refuses a missing or empty CA bundle: without it every TLS
// connection from the image (debuginfod, S3, backends) would fail.
func checkCerts(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("CA certificates: %w (install ca-certificates, or pass -ca-certificates)", err)
	}
	if n := strings.Count(string(b), "-----BEGIN CERTIFICATE-----"); n == 0 {
		return fmt.Errorf("CA certificates %s: no certificate in it", path)
	}
	return nil
}

// archMachine maps GOARCH to the ELF machine it builds.
var archMachine = map[string]string{"amd64": "EM_X86_64", "arm64": "EM_AARCH64"}

func checkStatic(path, arch string) error {
	machine, interp, err := elfInfo(path)
	if err != nil {
		return err
	}
	if machine != archMachine[arch] {
		return fmt.Errorf("%s is built for %s, not %s", path, machine, arch)
	}
	if interp {
		return fmt.Errorf("%s is dynamically linked (build it with CGO_ENABLED=0)", path)
	}
	return nil
}

// elfInfo reads an executable's machine and whether it asks for a dynamic
// loader (PT_INTERP).
func elfInfo(path string) (machine string, interp bool, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", false, fmt.Errorf("%s: not an executable (%v)", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp = true
		}
	}
	return f.Machine.String(), interp, nil
}
