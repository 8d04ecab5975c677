//go:build linux && (amd64 || arm64)

package sampler

import (
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestThreadContext runs the thread context fixture (testdata/src/threadctx,
// the variable in the program): 10 requests, each publishing its compute
// span for 100 ms of CPU in in_span, then 50 ms in outside with none. The
// Tracker must place the variable where the program's own code finds it
// (x86-64: below the fs base; arm64: above tpidr_el0), and the BPF program
// copy each sample's span ids as they were when it was taken. In the
// kernel matrix this runs on every kernel and on arm64.
func TestThreadContext(t *testing.T) {
	bin := testfixture.Build(t, testfixture.ThreadCtxProgram)
	s := newSampler(t, Config{SampleRate: 99, Runtimes: runtimes.Config{ThreadContext: true}})
	w := watch(s)
	const requests = 10
	f := startPiped(t, bin, strconv.Itoa(requests), "point")
	line := f.line
	v, ok := strings.CutPrefix(line(), "tls ")
	want, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		t.Fatalf("threadctx: no tls line")
	}
	if l := line(); l != "ready" {
		t.Fatalf("threadctx: %q, want ready", l)
	}
	pid := f.pid
	f.load(s)
	var entry bpf.ProfileTctxProc
	if err := s.objs.TctxProcs.Lookup(uint32(pid), &entry); err != nil || entry.TlsOff != want {
		t.Fatalf("tctx_procs[%d] = %d (%v), want %d (the program's own offset); %+v", pid, entry.TlsOff, err, want, s.ThreadContextStats())
	}
	time.Sleep(300 * time.Millisecond) // its table is built
	if _, err := s.Drain(); err != nil {
		t.Fatal(err)
	}
	f.send("go")
	if l := line(); l != "go" {
		t.Fatalf("threadctx: %q, want go", l)
	}
	type span struct {
		trace      string
		start, end int64
	}
	compute := map[string]span{}
	for l := line(); l != "done"; l = line() {
		f := strings.Fields(l)
		if len(f) != 6 || f[0] != "span" {
			t.Fatalf("threadctx: %q", l)
		}
		start, _ := strconv.ParseInt(f[3], 10, 64)
		end, _ := strconv.ParseInt(f[4], 10, 64)
		if f[5] == "compute" {
			compute[f[2]] = span{trace: f[1], start: start, end: end}
		}
	}
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
	inLo, inHi := funcRange(t, path, "in_span")
	outLo, outHi := funcRange(t, path, "outside")
	const slack = int64(20 * time.Millisecond) // the two clocks
	var inN, inOK, outN, outBad uint64
	bad := map[string]uint64{}
	for _, smp := range samplesOf(b, uint32(pid)) {
		sp := hex.EncodeToString(smp.SpanID[:])
		tr := hex.EncodeToString(smp.TraceID[:])
		hasIDs := smp.SpanID != [8]byte{} || smp.TraceID != [16]byte{}
		switch {
		case reachesFunc(maps, path, smp.UserPCs, inLo, inHi):
			inN += smp.Count
			c, known := compute[sp]
			switch {
			case !hasIDs:
				bad["no ids"] += smp.Count
			case !known || c.trace != tr:
				bad["ids of no compute span: "+tr+"/"+sp] += smp.Count
			case smp.FirstNs+slack < c.start || smp.LastNs > c.end+slack:
				bad["ids of a span not open then"] += smp.Count
			default:
				inOK += smp.Count
			}
		case reachesFunc(maps, path, smp.UserPCs, outLo, outHi):
			outN += smp.Count
			if hasIDs {
				outBad += smp.Count
			}
		}
	}
	t.Logf("in_span: %d of %d samples with their compute span's ids; outside: %d of %d with ids; %v", inOK, inN, outBad, outN, bad)
	if inN < 50 {
		t.Fatalf("%d samples in in_span: too few to judge", inN)
	}
	if inOK*100 < inN*99 {
		t.Errorf("%d of %d samples in in_span carry their span's ids, want >= 99%%: %v", inOK, inN, bad)
	}
	if outBad != 0 {
		t.Errorf("%d samples in outside carry ids", outBad)
	}
}
