package jfr

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Compression names how a recording is wrapped, found by its magic bytes.
type Compression string

const (
	None Compression = ""
	Gzip Compression = "gzip"
	Zstd Compression = "zstd"
	LZ4  Compression = "lz4"
)

// Detect tells a recording's compression from its first bytes. Profilers
// upload recordings compressed with any of these (the Datadog Java agent
// defaults to zstd, older ones lz4; Pyroscope's agent gzip).
func Detect(head []byte) Compression {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return Gzip
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return Zstd
	case bytes.HasPrefix(head, []byte{0x04, 0x22, 0x4d, 0x18}):
		return LZ4
	}
	return None
}

// Decompress returns b unwrapped when it is compressed, else b itself. It
// stops with an error wrapping ErrLimit as soon as the output would exceed
// max bytes, so a small bomb costs at most max bytes of memory.
func Decompress(b []byte, max int64) ([]byte, error) {
	c := Detect(b)
	if c == None {
		return b, nil
	}
	r, closeFn, err := decompressor(c, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("jfr: %s: %w: %v", c, ErrCorrupt, err)
	}
	defer closeFn()
	out, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("jfr: %s stream: %w", c, ErrTruncated)
		}
		return nil, fmt.Errorf("jfr: %s stream: %w: %v", c, ErrCorrupt, err)
	}
	if int64(len(out)) > max {
		return nil, fmt.Errorf("jfr: %s recording expands past %d bytes: %w", c, max, ErrLimit)
	}
	return out, nil
}

func decompressor(c Compression, r io.Reader) (io.Reader, func(), error) {
	switch c {
	case Gzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case Zstd:
		// Bounded window: a frame may not demand more than 64 MiB of history.
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, nil, err
		}
		return z, z.Close, nil
	case LZ4:
		return lz4.NewReader(r), func() {}, nil
	}
	return r, func() {}, nil
}
