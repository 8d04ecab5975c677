package elfx

import (
	"fmt"

	"github.com/klauspost/compress/zstd"
)

func unzstd(src []byte, size uint64) ([]byte, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(MaxDecompressedSection))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	out, err := dec.DecodeAll(src, make([]byte, 0, size))
	if err != nil {
		return nil, fmt.Errorf("zstd: %v: %w", err, ErrCorrupt)
	}
	if uint64(len(out)) != size {
		return nil, fmt.Errorf("zstd: got %d bytes, header says %d: %w", len(out), size, ErrCorrupt)
	}
	return out, nil
}
