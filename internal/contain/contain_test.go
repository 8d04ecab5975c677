package contain

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

func parseOther(b []byte) (err error) {
	defer Panic(func(r any) { err = errBoom })
	var m map[string]int
	m[string(b)] = 1 // panics: a nil map
	return nil
}

// Every contained panic is counted; the stack of each site's first goes to
// the watchers once, with the function and line that panicked, and a site
// seen before any watcher is logged when the first one comes.
func TestPanicCountedAndItsStackLoggedOnce(t *testing.T) {
	mu.Lock()
	sites = map[string]*site{} // as in a fresh process (go test -count)
	mu.Unlock()
	before := Count()
	parse(nil) // before any watcher
	core, logs := observer.New(zapcore.DebugLevel)
	stop := Watch(zap.New(core))
	defer stop()
	for range 3 {
		parse(nil)
		parseOther(nil)
	}
	if got := Count() - before; got != 7 {
		t.Errorf("Count grew by %d for 7 contained panics", got)
	}
	want := map[string]string{"contain.parse ": "index out of range", "contain.parseOther ": "nil map"}
	if logs.Len() != len(want) {
		t.Fatalf("%d lines logged for 2 sites: %v", logs.Len(), logs.All())
	}
	for _, e := range logs.All() {
		site, _ := e.ContextMap()["site"].(string)
		stack, _ := e.ContextMap()["stack"].(string)
		found := false
		for fn, value := range want {
			if strings.Contains(site, fn) {
				found = true
				if !strings.Contains(e.ContextMap()["panic"].(string), value) || !strings.Contains(stack, "contain_test.go") {
					t.Errorf("site %s: panic %q, stack:\n%s", site, e.ContextMap()["panic"], stack)
				}
			}
		}
		if !found || e.Level != zapcore.ErrorLevel {
			t.Errorf("logged %v %q for site %q", e.Level, e.Message, site)
		}
	}
	stop()
	// A new site after stop is counted, not logged to the stopped watcher.
	func() {
		defer Panic(func(any) {})
		panic("after stop")
	}()
	if logs.Len() != len(want) || Count()-before != 8 {
		t.Errorf("after stop: %d lines, count %d", logs.Len(), Count()-before)
	}
}
