package profbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize/symtab"
)

// The [vdso] is code the kernel maps into every process (clock_gettime,
// gettimeofday, getcpu...). It has no file a symbolizer could open
// elsewhere, so its frames are named here, from the image the process
// maps: read through /proc/PID/mem at its [vdso] mapping. A process can
// make its own vdso writable and change it, so the bytes are hostile:
// bounded, parsed by elfx and symtab (both fuzzed), and parsed once per
// distinct image (every 64-bit process of a kernel maps the same one).
const (
	// maxVDSOBytes bounds one read: the kernels map 8 KiB on x86-64 and
	// arm64; larger mappings are not a vdso anyone ships.
	maxVDSOBytes = 128 << 10
	// maxVDSOImages bounds the parsed images kept (64-bit, 32-bit and x32
	// processes map different ones; a process that rewrote its own makes
	// one more). Past it the cache starts over.
	maxVDSOImages = 8
)

// errVDSO marks an image that could not be read or parsed.
var errVDSO = errors.New("vdso")

// vdsoImage is one parsed vdso: its symbols, the ELF address of each
// image offset, and its build id.
type vdsoImage struct {
	tab     *symtab.Table
	loads   []elfx.Segment
	buildID string
}

// vaddr turns an offset into the image (the mapping starts at the image's
// first byte) into the ELF address symbols use.
func (v *vdsoImage) vaddr(off uint64) (uint64, bool) {
	for _, s := range v.loads {
		if off >= s.Off && off-s.Off < s.Filesz {
			return s.Vaddr + (off - s.Off), true
		}
	}
	return 0, false
}

// vdsoImages caches parsed images by content, across reports.
type vdsoImages struct {
	mu     sync.Mutex
	byHash map[[32]byte]*vdsoImage
}

// parseVDSO parses image bytes (hostile: see above).
func parseVDSO(b []byte) (*vdsoImage, error) {
	f, err := elfx.NewFile(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errVDSO, err)
	}
	defer f.Close()
	tab, err := symtab.New(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errVDSO, err)
	}
	img := &vdsoImage{tab: tab, loads: f.Loads()}
	if id, err := buildid.GNU(f); err == nil && len(id) > 0 {
		img.buildID = hex.EncodeToString(id)
	}
	return img, nil
}

// image returns the parsed vdso pid maps at m, reading procRoot/PID/mem.
func (c *vdsoImages) image(procRoot string, pid int, m *normalize.Mapping) (*vdsoImage, error) {
	size := m.End - m.Start
	if m.End <= m.Start || size > maxVDSOBytes {
		return nil, fmt.Errorf("%w: mapping of %d bytes", errVDSO, size)
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mem"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, size)
	if n, err := f.ReadAt(b, int64(m.Start)); n != len(b) {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	sum := sha256.Sum256(b)
	c.mu.Lock()
	img, ok := c.byHash[sum]
	c.mu.Unlock()
	if ok {
		return img, nil
	}
	img, err = parseVDSO(b)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.byHash == nil || len(c.byHash) >= maxVDSOImages {
		c.byHash = map[[32]byte]*vdsoImage{}
	}
	c.byHash[sum] = img
	c.mu.Unlock()
	return img, nil
}

// vdsoFrame names a frame in po's [vdso] mapping m, at the ELF address of
// the image; the mapping carries the image's build id (a kernel's vdso
// debug file has it too). A vdso that cannot be read (no ptrace access) or
// parsed leaves the frame raw at its image offset, counted as
// unreadable_file.
func (r *run) vdsoFrame(po *procOut, m *normalize.Mapping, addr uint64) frame {
	img, ok := r.vdso[m]
	if !ok {
		var err error
		if img, err = r.b.vdso.image(r.b.opt.ProcRoot, po.pid, m); err != nil {
			r.b.log.Debug("vdso unreadable", zap.Int("pid", po.pid), zap.Error(err))
		}
		r.vdso[m] = img
	}
	off := addr - m.Start
	mi, ok := r.mappings[m]
	if !ok {
		var attrs []int32
		if img != nil && img.buildID != "" {
			attrs = append(attrs, r.dict.AttrStr(pframe.AttrBuildIDGNU, img.buildID))
		}
		mi = r.dict.Mapping(pdict.Mapping{Start: m.Start, Limit: m.End, Offset: m.Offset, File: m.Path, Attrs: attrs})
		r.mappings[m] = mi
	}
	if img == nil {
		r.fail(ReasonUnreadableFile)
		return r.rawFrame(mi, off, m.Path, pframe.TypeNative)
	}
	vaddr, ok := img.vaddr(off)
	if !ok {
		r.fail(ReasonNoLoadSegment)
		return r.rawFrame(mi, off, m.Path, pframe.TypeNative)
	}
	name, _, _, ok := img.tab.Lookup(vaddr)
	var f frame
	if ok {
		f = r.namedFrame(mi, vaddr, m.Path, pframe.TypeNative, name)
	} else {
		f = r.rawFrame(mi, vaddr, m.Path, pframe.TypeNative)
	}
	f.gnu = img.buildID
	return f
}
