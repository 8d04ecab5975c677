package elfx

import (
	"bytes"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// A zstd frame names the window its decoder must allocate, whatever the
// stream then holds. Compilers and linkers use the default levels (windows
// of 8 MiB at most), and a window never needs to exceed the content, so the
// cap is the claimed size rounded up, between minZstdWindow and
// maxZstdWindow.
const (
	minZstdWindow = 8 << 20
	maxZstdWindow = 64 << 20
)

// newZstd is a streaming decoder over src whose memory is bounded by the
// claimed size and maxZstdWindow, not by what the frame header asks for.
func newZstd(src []byte, size uint64) (*zstd.Decoder, error) {
	window := uint64(minZstdWindow)
	for window < size && window < maxZstdWindow {
		window *= 2
	}
	dec, err := zstd.NewReader(bytes.NewReader(src),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(window),
		// The decoder caps its window at this too; the output itself is
		// bounded by the caller reading at most size+1 bytes.
		zstd.WithDecoderMaxMemory(max(size+1, window)))
	if err != nil {
		return nil, fmt.Errorf("zstd: %v: %w", err, ErrCorrupt)
	}
	return dec, nil
}
