package testfixture

import (
	"strings"
	"testing"
)

// WantErrors checks that err (an errors.Join of one error per line, as the
// components' Validate returns) holds exactly the errors want names, each by
// a part of its message.
func WantErrors(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	got := strings.Split(err.Error(), "\n")
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d errors (%q), want %d", len(got), err, len(want))
	}
}
