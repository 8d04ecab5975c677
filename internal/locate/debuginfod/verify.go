package debuginfod

import (
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
)

// verifyPath checks that the downloaded file is ELF with GNU build id want.
func verifyPath(path, want string) error {
	f, err := elfx.Open(path)
	if err != nil {
		if errors.Is(err, frame.ErrCorruptFile) {
			return fmt.Errorf("body is not an ELF file: %w", err)
		}
		return fmt.Errorf("reading download: %w: %v", frame.ErrFetchFailed, err)
	}
	defer f.Close()
	return verifyELF(f, want)
}

// verifyELF compares f's GNU build id with want (lowercase hex). Bodies are
// untrusted, so a panic in the parsers below is turned into ErrCorruptFile.
func verifyELF(f *elfx.File, want string) (err error) {
	defer contain.Panic(func(r any) { err = fmt.Errorf("parsing body: %v: %w", r, frame.ErrCorruptFile) })
	id, err := buildid.GNU(f)
	switch {
	case errors.Is(err, buildid.ErrNotFound):
		return fmt.Errorf("body has no GNU build id, want %s: %w", want, frame.ErrBuildIDMismatch)
	case errors.Is(err, frame.ErrCorruptFile):
		return fmt.Errorf("body's build id note: %w", err)
	case err != nil:
		return fmt.Errorf("body's build id note: %v: %w", err, frame.ErrCorruptFile)
	}
	if got := buildid.HexString(id); got != want {
		return fmt.Errorf("body has build id %s, want %s: %w", got, want, frame.ErrBuildIDMismatch)
	}
	return nil
}
