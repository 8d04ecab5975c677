package locate

import (
	"slices"
	"testing"
)

// TestSupPaths: the places a recorded dwz file name leads to stay inside
// the debug directories or the referring file's folder, however the name
// tries to leave them.
func TestSupPaths(t *testing.T) {
	dirs := []string{"/usr/lib/debug", "/srv/debug"}
	from := "/usr/lib/debug/.build-id/ab/cdef.debug"
	for _, c := range []struct {
		name string
		want []string
	}{
		{"/usr/lib/debug/.dwz/x86_64-linux-gnu/libc6.debug", []string{
			"/usr/lib/debug/.dwz/x86_64-linux-gnu/libc6.debug", "/srv/debug/.dwz/x86_64-linux-gnu/libc6.debug"}},
		{"../../.dwz/libfoo.debug", []string{"/usr/lib/debug/.dwz/libfoo.debug", "/srv/debug/.dwz/libfoo.debug"}},
		{"common.debug", []string{"/usr/lib/debug/.dwz/common.debug", "/srv/debug/.dwz/common.debug",
			"/usr/lib/debug/.build-id/ab/common.debug"}},
		// Escapes: only the .dwz/ guesses by base name remain.
		{"/etc/shadow", []string{"/usr/lib/debug/.dwz/shadow", "/srv/debug/.dwz/shadow"}},
		{"../../../../etc/passwd", []string{"/usr/lib/debug/.dwz/passwd", "/srv/debug/.dwz/passwd"}},
		{"/x/.dwz/../../etc/passwd", nil},
		{"/usr/lib/debug/../../../etc/passwd", []string{"/usr/lib/debug/.dwz/passwd", "/srv/debug/.dwz/passwd"}},
		{"..", nil},
		{"", nil},
		{"a\x00b", nil},
	} {
		got := supPaths(dirs, c.name, from)
		if !slices.Equal(got, c.want) {
			t.Errorf("%q: got %q, want %q", c.name, got, c.want)
		}
	}
}
