package gopclntab

import (
	"bytes"
	"debug/buildinfo"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// GoVersion returns the Go release that built f ("go1.26.8"), from the
// build info the linker embeds; it survives -s -w.
func GoVersion(f *elfx.File) (string, error) {
	bi, err := buildinfo.Read(bytes.NewReader(f.Bytes()))
	if err != nil {
		return "", fmt.Errorf("gopclntab: build info: %v: %w", err, frame.ErrNoDebugInfo)
	}
	return bi.GoVersion, nil
}

// GoBuildID returns the Go build ID ("actionID/contentID..." as printed by
// `go tool buildid`) from the .note.go.buildid note.
func GoBuildID(f *elfx.File) (string, error) {
	b, err := f.SectionData(".note.go.buildid")
	if err != nil {
		return "", fmt.Errorf("gopclntab: %v: %w", err, frame.ErrNoDebugInfo)
	}
	// One ELF note: namesz, descsz, type (4 = Go build ID), "Go\0\0", desc.
	if len(b) < 16 {
		return "", fmt.Errorf("gopclntab: short Go build ID note: %w", frame.ErrCorruptFile)
	}
	bo := f.ByteOrder
	namesz, descsz, typ := uint64(bo.Uint32(b)), uint64(bo.Uint32(b[4:])), bo.Uint32(b[8:])
	name := (namesz + 3) &^ 3
	if typ != 4 || namesz != 4 || string(b[12:15]) != "Go\x00" || uint64(len(b)-12) < name || uint64(len(b)-12)-name < descsz {
		return "", fmt.Errorf("gopclntab: bad Go build ID note: %w", frame.ErrCorruptFile)
	}
	return string(b[12+name : 12+name+descsz]), nil
}
