package elfx

import "testing"

// A decompression mapping may take half of what RLIMIT_AS leaves, no more:
// the rest is the heap's.
func TestRoomFor(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		n, limit, used int64
		ok             bool
	}{
		{200 << 20, 2 * gib, 1600 << 20, true},
		{300 << 20, 2 * gib, 1600 << 20, false},
		{512 << 20, 8 * gib, 1600 << 20, true},
		{1, 2 * gib, 2 * gib, false},
	} {
		if got := roomFor(c.n, c.limit, c.used); got != c.ok {
			t.Errorf("roomFor(%d, %d, %d) = %v, want %v", c.n, c.limit, c.used, got, c.ok)
		}
	}
	if n, ok := mappedBytes(); !ok || n < 1<<20 {
		t.Errorf("mappedBytes = %d, %v", n, ok)
	}
}
