package debuginfod

import (
	"errors"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// FuzzVerify feeds arbitrary bodies to the check every download goes
// through: it must never panic, and must reject with a countable reason.
func FuzzVerify(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	_, strippedA, debugA := split(f, "a", idA)
	for _, p := range []string{strippedA, debugA} {
		b := read(f, p)
		f.Add(b)
		f.Add(b[:64])
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		ef, err := elfx.NewFile(body)
		if err != nil {
			if !errors.Is(err, frame.ErrCorruptFile) {
				t.Fatalf("non-ELF body: %v", err)
			}
			return
		}
		err = verifyELF(ef, idA)
		if err != nil && !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, frame.ErrBuildIDMismatch) {
			t.Fatalf("unclassified rejection: %v", err)
		}
	})
}

// FuzzParseURLs: DEBUGINFOD_URLS comes from the environment, and whatever
// survives parsing must be usable as a prefix.
func FuzzParseURLs(f *testing.F) {
	f.Add("http://127.0.0.1:8002/ ima:enforcing https://h/p//")
	f.Fuzz(func(t *testing.T, s string) {
		for _, u := range ParseURLs(s) {
			if _, err := normalizeURL(u); err != nil {
				t.Fatalf("ParseURLs kept %q: %v", u, err)
			}
		}
	})
}
