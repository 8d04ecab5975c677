package cpython

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"runtime"
	"strings"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/normalize"
)

// symSizeofPthread is glibc's own description of struct pthread for
// libthread_db (nptl_db): a uint32 in .rodata, exported in .dynsym.
const symSizeofPthread = "_thread_db_sizeof_pthread"

// maxTPSelf bounds what threadSelf accepts (1,856 bytes in bookworm's arm64
// glibc 2.36); the walker takes it as a uint16.
const maxTPSelf = 1 << 14

// threadSelf returns, for p's threads, the thread pointer less
// pthread_self(), which is what a thread state's thread_id holds. On x86-64
// the two are the same (TLS variant II: the thread descriptor starts at the
// thread pointer). On arm64 (variant I) glibc puts struct pthread just
// below the thread pointer, so the distance is the struct's size in the
// process's own glibc, which changes between glibc releases: it is read
// from that glibc rather than assumed.
func (r *Runtime) threadSelf(procDir string, p *normalize.Process, interp *normalize.Mapping) (uint64, error) {
	if runtime.GOARCH == "amd64" {
		return 0, nil
	}
	m, libc := interp, false // a static interpreter carries its own glibc
	for i := range p.Mappings {
		mm := &p.Mappings[i]
		if mm.File != nil && !mm.Anonymous && isGlibc(path.Base(mm.Path)) {
			m, libc = mm, true
			break
		}
	}
	if v, ok := r.selfs.Get(m.File.ID); ok {
		return v, nil
	}
	f, err := openFile(procDir, candidate{m: m})
	if err != nil {
		return 0, notReady(err)
	}
	defer func() { _ = f.Close() }()
	v, err := sizeofPthread(f, m.Path)
	if err == nil {
		r.selfs.Add(m.File.ID, v)
		return v, nil
	}
	if !errors.Is(err, errNoPthread) || libc {
		return 0, err
	}
	// Most likely the loader has not mapped libc yet; after maxAttachTry
	// snapshots without it, refused with this reason.
	return 0, fmt.Errorf("%w: no glibc mapped (nor %s in %s): pthread_self() is not known", errNotReady, symSizeofPthread, m.Path)
}

var errNoPthread = errors.New("no " + symSizeofPthread + " (not glibc): pthread_self() is not known")

// sizeofPthread reads glibc's size of struct pthread from file f (named
// name in errors).
func sizeofPthread(f *elfx.File, name string) (uint64, error) {
	syms, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return 0, fmt.Errorf("%s symbols: %w: %w", name, err, errLayout)
	}
	for _, s := range syms {
		if s.Name != symSizeofPthread || s.Size != 4 {
			continue
		}
		b, err := f.ReadVaddr(s.Value, 4)
		if err != nil {
			return 0, fmt.Errorf("%s: reading %s: %w", name, symSizeofPthread, errLayout)
		}
		v := uint64(binary.LittleEndian.Uint32(b))
		if v < 64 || v >= maxTPSelf || v%8 != 0 {
			return 0, fmt.Errorf("%s: %s is %d: %w", name, symSizeofPthread, v, errLayout)
		}
		return v, nil
	}
	return 0, fmt.Errorf("%s: %w: %w", name, errNoPthread, errUnsupported)
}

// isGlibc reports whether a file name is glibc's libc (libc.so.6; libc-2.N.so
// before 2.34 installed it under that name, libc.so.6 its link).
func isGlibc(base string) bool {
	return base == "libc.so.6" || strings.HasPrefix(base, "libc-2.") && strings.HasSuffix(base, ".so")
}
