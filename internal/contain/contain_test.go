package contain

import (
	"errors"
	"testing"
)

var errBoom = errors.New("contained")

func parse(b []byte) (n int, err error) {
	defer Panic(func(r any) { n, err = 0, errBoom })
	n = int(b[3]) // panics on short input
	return n, nil
}

func TestPanicContained(t *testing.T) {
	if n, err := parse([]byte{1, 2, 3, 4}); n != 4 || err != nil {
		t.Fatalf("parse = %d, %v", n, err)
	}
	if n, err := parse(nil); n != 0 || !errors.Is(err, errBoom) {
		t.Fatalf("parse(nil) = %d, %v; want the panic contained", n, err)
	}
}

func TestOffLetsPanicThrough(t *testing.T) {
	restore := Off()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("with containment off, the parser's panic did not reach its caller")
			}
		}()
		parse(nil)
	}()
	restore()
	restore() // a second call changes nothing
	if _, err := parse(nil); !errors.Is(err, errBoom) {
		t.Fatalf("after restore: %v; want the panic contained", err)
	}
}
