package sharedcomponent

import (
	"errors"
	"sync"
	"testing"
)

type config struct{ name string }

func TestAcquireRelease(t *testing.T) {
	m := NewMap[*config, *int]()
	a, b := &config{"a"}, &config{"a"} // equal contents, two configurations
	made := 0
	create := func() (*int, error) { made++; n := made; return &n, nil }
	x, _ := m.Acquire(a, create)
	y, _ := m.Acquire(a, create)
	z, _ := m.Acquire(b, create)
	if x != y || x == z || made != 2 {
		t.Fatalf("instances %p %p %p, %d made; want one per configuration", x, y, z, made)
	}
	if _, users, ok := m.Get(a); !ok || users != 2 {
		t.Fatalf("Get(a): %d users, %v", users, ok)
	}
	if _, last := m.Release(a); last {
		t.Fatal("first release of two reported last")
	}
	if v, last := m.Release(a); !last || v != x {
		t.Fatalf("second release: %p, last %v", v, last)
	}
	if _, last := m.Release(a); last {
		t.Fatal("a release without an acquire reported last")
	}
	if w, _ := m.Acquire(a, create); w == x || made != 3 {
		t.Fatal("after the last release, Acquire reused the old instance")
	}
	if m.Len() != 2 {
		t.Fatalf("Len %d, want 2", m.Len())
	}
}

func TestCreateFails(t *testing.T) {
	m := NewMap[string, int]()
	boom := errors.New("boom")
	if _, err := m.Acquire("k", func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("Acquire: %v", err)
	}
	if m.Len() != 0 {
		t.Fatal("a failed create left an entry")
	}
}

func TestConcurrentAcquireMakesOne(t *testing.T) {
	m := NewMap[string, *int]()
	n := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			m.Acquire("k", func() (*int, error) { n++; return new(int), nil })
		})
	}
	wg.Wait()
	if _, users, _ := m.Get("k"); n != 1 || users != 16 {
		t.Fatalf("%d made, %d users; want 1 and 16", n, users)
	}
}
