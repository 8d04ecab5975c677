package symstore

import (
	"debug/elf"
	"errors"
	"fmt"
	"net/http"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/elfx/keepdebug"
)

// Verify checks an uploaded file: a well-formed ELF file that carries the
// id of key (a GNU build id in hex, or "gobuildid/HEX") and, for
// debuginfo, symbols.
func Verify(path, rawKey string, kind Kind) *RejectError {
	key, err := ParseKey(rawKey)
	if err != nil {
		return reject(ReasonInvalidBuildID, http.StatusBadRequest, err)
	}
	return verifyKey(path, key, kind)
}

func verifyKey(path string, key Key, kind Kind) *RejectError {
	f, err := elfx.Open(path)
	if err != nil {
		return reject(ReasonNotELF, http.StatusUnprocessableEntity, fmt.Errorf("not a well-formed ELF file: %v", err))
	}
	defer f.Close()
	switch key.NS {
	case NSGoBuildID:
		got, err := buildid.Go(f)
		if err != nil {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file has no Go build id: %v", err))
		}
		if want := key.GoBuildID(); got != want {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file's Go build id is %.300q, not %q", got, want))
		}
	default:
		got, err := buildid.GNU(f)
		if err != nil {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file has no GNU build id: %v", err))
		}
		if buildid.HexString(got) != key.ID {
			return reject(ReasonMismatch, http.StatusUnprocessableEntity, fmt.Errorf("the file's build id is %x, not %s", got, key.ID))
		}
	}
	if kind == DebugInfo && !keepdebug.HasSymbols(f) {
		return reject(ReasonNoSymbols, http.StatusUnprocessableEntity, errors.New("the file has no DWARF, .symtab, .gopclntab or .gnu_debugdata"))
	}
	// A forged section table pointing past the end is caught here rather
	// than by every later reader.
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_NOBITS || sec.Type == elf.SHT_NULL {
			continue
		}
		if end := sec.Offset + sec.FileSize; end < sec.Offset || end > uint64(len(f.Bytes())) {
			return reject(ReasonNotELF, http.StatusUnprocessableEntity, fmt.Errorf("section %.64q lies outside the file (truncated?)", sec.Name))
		}
	}
	return nil
}
