package symbolize

import (
	"context"
	"reflect"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// TestPrefetchSameAnswers looks addresses up while Prefetch parses their
// units on other goroutines (racing the lookups for the same units), and
// compares every frame with a resolver that never prefetches.
func TestPrefetchSameAnswers(t *testing.T) {
	bin := testfixture.Build(t, testfixture.Spec{Name: "cpp-O2", Lang: "c++", Sources: []string{"engine/cpp/main.cc"}, Args: []string{"-O2", "-g", "-std=c++17"}})
	addrs := sampleAddresses(t, bin, 3000)
	plain := New(DefaultOptions())
	defer plain.Close()
	want := plain.Symbolize(context.Background(), bin, "", addrs)

	r := New(DefaultOptions())
	defer r.Close()
	h, err := r.Open(context.Background(), bin, "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Prefetch(addrs, 4)
	h.Prefetch(addrs[len(addrs)/2:], 2) // overlapping work: each unit parsed once
	for i, a := range addrs {
		got, err := h.Lookup(a, nil)
		if !reflect.DeepEqual(got, want[i].Frames) || (err == nil) != (want[i].Err == nil) {
			t.Fatalf("%#x: with prefetch %+v (%v), without %+v (%v)", a, got, err, want[i].Frames, want[i].Err)
		}
	}
}
