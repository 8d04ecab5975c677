package runtimes

import (
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

// Each runtime owns its block of frame kinds, HotSpot's 1-15 and
// CPython's 16-31 (bpf/runtime.h).
func TestFrameType(t *testing.T) {
	for kind, want := range map[uint8]string{0: frame.TypeNative, 1: frame.TypeJVM, 15: frame.TypeJVM,
		16: frame.TypeCPython, 31: frame.TypeCPython, 32: frame.TypeNative} {
		if got := FrameType(kind); got != want {
			t.Errorf("kind %d: %s, want %s", kind, got, want)
		}
	}
}
