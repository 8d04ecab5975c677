package frame

import (
	"strings"
	"testing"
	"unicode/utf8"

	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// The frame types are semconv's enumeration values.
func TestFrameTypesAreSemconv(t *testing.T) {
	for got, want := range map[string]string{
		TypeNative: semconv.ProfileFrameTypeNative.Value.AsString(),
		TypeKernel: semconv.ProfileFrameTypeKernel.Value.AsString(),
		TypeGo:     semconv.ProfileFrameTypeGo.Value.AsString(),
		TypeJVM:    semconv.ProfileFrameTypeJVM.Value.AsString(),
		TypeV8JS:   semconv.ProfileFrameTypeV8JS.Value.AsString(),
		TypeDotnet: semconv.ProfileFrameTypeDotnet.Value.AsString(),
	} {
		if got != want {
			t.Errorf("frame type %q, semconv says %q", got, want)
		}
	}
}

func TestIdentity(t *testing.T) {
	gnu := "8a7b6c5d0011223344556677889900aabbccddee"
	id, err := ParseIdentity(strings.ToUpper(gnu), "", "00112233445566778899aabbccddeeff")
	if err != nil || id.GNU != gnu || id.Key() != "g:"+gnu {
		t.Fatalf("ParseIdentity = %+v, %v", id, err)
	}
	for _, bad := range [][3]string{{"../x", "", ""}, {"", "a//b", ""}, {"", "", strings.Repeat("f", 1<<20)}} {
		if _, err := ParseIdentity(bad[0], bad[1], bad[2]); Reason(err) != "invalid_build_id" {
			t.Errorf("ParseIdentity(%.20q) = %v", bad, err)
		}
	}
	// GNU decides when both sides have one, even if the htlhash agrees.
	if id.Matches(Identity{GNU: "00000000", HTL: id.HTL}) {
		t.Error("another GNU build id matched")
	}
	if !id.Matches(Identity{GNU: gnu, HTL: "ffff0000"}) || !(Identity{HTL: id.HTL}).Matches(Identity{HTL: id.HTL}) {
		t.Error("same file did not match")
	}
	if (Identity{HTL: id.HTL}).MatchesDebug(Identity{HTL: id.HTL}) {
		t.Error("a debug file cannot be matched by htlhash")
	}
	if (Identity{}).Matches(Identity{}) {
		t.Error("empty identities matched")
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate(strings.Repeat("x", 500<<10), 4096); len(got) != 4096 || !strings.HasSuffix(got, TruncSuffix) {
		t.Errorf("len %d", len(got))
	}
	s := strings.Repeat("é", 100) // 2 bytes each
	for max := 1; max < 40; max++ {
		if got := Truncate(s, max); len(got) > max || !utf8.ValidString(got[:len(got)-min(len(got), len(TruncSuffix))]) {
			t.Errorf("Truncate(_, %d) = %q", max, got)
		}
	}
	if Truncate("short", 0) != "short" || Truncate("short", 5) != "short" {
		t.Error("short names changed")
	}
}
