package buildid

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/profsym/profsym/internal/elfx"
)

// htlPart is the size of the head and of the tail that HTLHash covers.
const htlPart = 4096

// HTLHash computes OpenTelemetry's file id for files without a usable build
// id (process.executable.build_id.htlhash, formerly ".profiling"): SHA-256
// over the first 4096 bytes, then the last 4096 bytes, then the length as a
// big-endian uint64; the id is the first 16 bytes in lowercase hex.
//
// For files shorter than 4096 bytes both parts are the whole file, and for
// files shorter than 8192 bytes the parts overlap; neither is padded. That is
// what the OpenTelemetry profiling spec says ("may overlap, not padded",
// specification/profiles/mappings.md) and what the reference agent does
// (opentelemetry-ebpf-profiler libpf/fileid.go, FileIDFromExecutableReader:
// head = first min(size, 4096) bytes, tail = last min(size, 4096) bytes).
//
// Only the head and tail are read.
func HTLHash(r io.ReaderAt, size int64) (string, error) {
	if size < 0 {
		return "", fmt.Errorf("htlhash: negative size %d", size)
	}
	n := min(size, htlPart)
	buf := make([]byte, n)
	h := sha256.New()
	if err := readFull(r, buf, 0); err != nil {
		return "", fmt.Errorf("htlhash: head: %w", err)
	}
	h.Write(buf)
	if err := readFull(r, buf, size-n); err != nil {
		return "", fmt.Errorf("htlhash: tail: %w", err)
	}
	h.Write(buf)
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(size))
	h.Write(l[:])
	return HexString(h.Sum(nil)[:16]), nil
}

func readFull(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil // io.EOF alongside a full read is fine
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// HTLHashOf is HTLHash of an opened ELF file's image.
func HTLHashOf(f *elfx.File) (string, error) {
	b := f.Bytes()
	return HTLHash(bytes.NewReader(b), int64(len(b)))
}
