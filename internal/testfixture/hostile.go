package testfixture

import (
	"bytes"
	"compress/zlib"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Section is one section of a hand-built ELF file (see BuildELF).
type Section struct {
	Name  string
	Type  elf.SectionType
	Flags elf.SectionFlag
	Data  []byte
}

// BuildELF writes a minimal little-endian ELF64 x86-64 shared object with
// the given sections (and the section-name table) and nothing else: enough
// for debug/elf and elfx, and small enough to forge any header a hostile
// file could carry.
func BuildELF(secs ...Section) []byte {
	var shstr bytes.Buffer
	shstr.WriteByte(0)
	names := make([]uint32, len(secs)+1)
	for i, s := range secs {
		names[i] = uint32(shstr.Len())
		shstr.WriteString(s.Name)
		shstr.WriteByte(0)
	}
	names[len(secs)] = uint32(shstr.Len())
	shstr.WriteString(".shstrtab\x00")

	var body bytes.Buffer
	body.Write(make([]byte, 64)) // the ELF header, written last
	offs := make([]uint64, len(secs)+1)
	for i, s := range secs {
		offs[i] = uint64(body.Len())
		body.Write(s.Data)
	}
	offs[len(secs)] = uint64(body.Len())
	body.Write(shstr.Bytes())
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := uint64(body.Len())
	le := binary.LittleEndian
	sh := make([]byte, 64)
	body.Write(sh) // SHN_UNDEF
	all := append(append([]Section(nil), secs...), Section{Type: elf.SHT_STRTAB, Data: shstr.Bytes()})
	for i, s := range all {
		clear(sh)
		le.PutUint32(sh[0:], names[i])
		le.PutUint32(sh[4:], uint32(s.Type))
		le.PutUint64(sh[8:], uint64(s.Flags))
		le.PutUint64(sh[24:], offs[i])
		le.PutUint64(sh[32:], uint64(len(s.Data)))
		le.PutUint64(sh[48:], 1)
		body.Write(sh)
	}
	out := body.Bytes()
	h := out[:64]
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(h[16:], uint16(elf.ET_DYN))
	le.PutUint16(h[18:], uint16(elf.EM_X86_64))
	le.PutUint32(h[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(h[40:], shoff)
	le.PutUint16(h[52:], 64) // e_ehsize
	le.PutUint16(h[58:], 64) // e_shentsize
	le.PutUint16(h[60:], uint16(len(all)+1))
	le.PutUint16(h[62:], uint16(len(all)))
	return out
}

// Zeros is an io.Reader of n zero bytes, the payload of a compression bomb.
func Zeros(n int64) io.Reader { return io.LimitReader(zeroReader{}, n) }

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// CompressedSection is an SHF_COMPRESSED section whose header claims
// claim bytes and whose stream (zlib or zstd) really holds real zero bytes.
// With real == claim it is an honest, highly compressible section (a
// compression bomb when claim is large); otherwise the header lies.
func CompressedSection(t testing.TB, name string, typ elf.CompressionType, claim, real int64) Section {
	t.Helper()
	var b bytes.Buffer
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint32(hdr[0:], uint32(typ))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(claim))
	binary.LittleEndian.PutUint64(hdr[16:], 1)
	b.Write(hdr)
	var w io.WriteCloser
	var err error
	switch typ {
	case elf.COMPRESS_ZLIB:
		w, err = zlib.NewWriterLevel(&b, zlib.BestCompression)
	case elf.COMPRESS_ZSTD:
		w, err = zstd.NewWriter(&b, zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
	default:
		t.Fatalf("compression type %v", typ)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, Zeros(real)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return Section{Name: name, Type: elf.SHT_PROGBITS, Flags: elf.SHF_COMPRESSED, Data: b.Bytes()}
}

// XZ compresses n zero bytes with xz, as .gnu_debugdata holds
// MiniDebugInfo: an xz bomb when n is large.
func XZ(t testing.TB, n int64) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := xz.NewWriter(&b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, Zeros(n)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// BuildIDNote is a .note.gnu.build-id section carrying id (hex), so that a
// hand-built file passes the build-id checks of debuginfod and debug
// directories and reaches the parsers behind them.
func BuildIDNote(t testing.TB, id string) Section {
	t.Helper()
	desc, err := hex.DecodeString(id)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16, 16+len(desc)+3)
	binary.LittleEndian.PutUint32(b[0:], 4)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(desc)))
	binary.LittleEndian.PutUint32(b[8:], 3) // NT_GNU_BUILD_ID
	copy(b[12:], "GNU\x00")
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return Section{Name: ".note.gnu.build-id", Type: elf.SHT_NOTE, Flags: elf.SHF_ALLOC, Data: b}
}
