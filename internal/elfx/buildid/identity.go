package buildid

import (
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Identify returns what an opened file says about itself: its GNU build id,
// Go build id and htlhash, each only when it is well formed by the frame
// contract's rules (a file's odd 2-byte "build id" is no identity). This is
// the one place a file's identity is computed, on the host and wherever a
// file is matched against a mapping.
func Identify(f *elfx.File) frame.Identity {
	var id frame.Identity
	if b, err := GNU(f); err == nil {
		id.GNU, _ = frame.ParseBuildID(HexString(b))
	}
	if g, err := Go(f); err == nil {
		id.Go, _ = frame.ParseGoBuildID(g)
	}
	id.HTL, _ = HTLHashOf(f)
	return id
}
