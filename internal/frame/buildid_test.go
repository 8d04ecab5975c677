package frame

import (
	"errors"
	"strings"
	"testing"
)

func TestParseBuildID(t *testing.T) {
	good := map[string]string{
		"8a7b6c5d": "8a7b6c5d",
		"8A7B6C5D0011223344556677889900AABBCCDDEE": "8a7b6c5d0011223344556677889900aabbccddee",
		strings.Repeat("ab", MaxBuildIDBytes):      strings.Repeat("ab", MaxBuildIDBytes),
	}
	for in, want := range good {
		got, err := ParseBuildID(in)
		if err != nil || got != want {
			t.Errorf("ParseBuildID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{"", "abc", "abcdef", "../../etc/passwd", "ab/cdef0", "0123456g",
		"abcd\x00efg", strings.Repeat("ab", MaxBuildIDBytes+1), strings.Repeat("a", 1<<20)}
	for _, in := range bad {
		if _, err := ParseBuildID(in); !errors.Is(err, ErrInvalidBuildID) {
			t.Errorf("ParseBuildID(%.40q) = %v, want ErrInvalidBuildID", in, err)
		}
		if err := Reason(mustErr(ParseBuildID(in))); err != "invalid_build_id" {
			t.Errorf("Reason = %q", err)
		}
	}
}

func mustErr(_ string, err error) error { return err }

func TestParseGoBuildID(t *testing.T) {
	if _, err := ParseGoBuildID("pRZzvCdAEdGPJ7Vb8sX2/0A1b_-c/xyz/Q9"); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{"", "a/../b", "a//b", "a b", "a\nb", strings.Repeat("x", MaxGoBuildIDLen+1)} {
		if _, err := ParseGoBuildID(in); !errors.Is(err, ErrInvalidBuildID) {
			t.Errorf("ParseGoBuildID(%.40q) = %v", in, err)
		}
	}
}
