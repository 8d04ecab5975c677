//go:build linux && (amd64 || arm64)

package sampler

import (
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestGoLabels runs the Go labels fixture (testdata/src/golabels): one
// goroutine spins in main.labelled inside pprof.Do (request=a), another in
// main.unlabelled with none. The walker reads the running goroutine's
// labels pointer (amd64: g from the TLS slot; arm64: g from x28), and the
// host reads the set it points at. In the kernel matrix this runs on every
// kernel and on arm64.
func TestGoLabels(t *testing.T) {
	bin := testfixture.Build(t, goLabelsFix)
	s := newSampler(t, Config{SampleRate: 99, Runtimes: runtimes.Config{
		GoLabels: true, MaxLabels: runtimes.DefaultMaxLabels, MaxLabelBytes: runtimes.DefaultMaxLabelBytes,
	}})
	w := watch(s)
	f := startPiped(t, bin, fixtureSeconds)
	next := func(want string) {
		t.Helper()
		if l := f.line(); l != want {
			t.Fatalf("golabels: %q, want %q", l, want)
		}
	}
	next("ready")
	pid := f.pid
	f.load(s)
	if st := s.Runtimes().LabelStats(); st.Attached != 1 {
		t.Fatalf("labels not read for the fixture: %+v", st)
	}
	time.Sleep(300 * time.Millisecond) // its table is built
	if _, err := s.Drain(); err != nil {
		t.Fatal(err)
	}
	f.send("go")
	next("go")
	next("done")
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(2*time.Second, func() bool { return w.mapsOf(uint32(pid)) != nil })
	maps := w.mapsOf(uint32(pid))
	if maps == nil {
		t.Fatalf("no maps of pid %d", pid)
	}
	path := realPath(t, bin)
	lLo, lHi := funcRange(t, path, "main.labelled")
	uLo, uHi := funcRange(t, path, "main.unlabelled")
	var nIn, inOK, nOut, outBad uint64
	for _, smp := range samplesOf(b, uint32(pid)) {
		labels := s.Runtimes().Labels(pid, smp.GoLabels)
		switch {
		case reachesFunc(maps, path, smp.UserPCs, lLo, lHi):
			nIn += smp.Count
			if len(labels) == 1 && labels[0] == (runtimes.Label{Key: "request", Value: "a"}) {
				inOK += smp.Count
			}
		case reachesFunc(maps, path, smp.UserPCs, uLo, uHi):
			nOut += smp.Count
			if smp.GoLabels != 0 {
				outBad += smp.Count
			}
		}
	}
	t.Logf("main.labelled: %d of %d samples labelled request=a; main.unlabelled: %d of %d labelled", inOK, nIn, outBad, nOut)
	// 3 s of CPU at 99 Hz each (fewer in an emulated VM).
	if nIn < 100 || nOut < 100 {
		t.Fatalf("%d samples in main.labelled, %d in main.unlabelled: too few to judge", nIn, nOut)
	}
	if inOK*100 < nIn*99 {
		t.Errorf("%d of %d samples in main.labelled carry request=a, want >= 99%%", inOK, nIn)
	}
	if outBad != 0 {
		t.Errorf("%d samples in main.unlabelled carry labels", outBad)
	}
}
