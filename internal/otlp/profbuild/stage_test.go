package profbuild

import (
	"errors"
	"os"
	"testing"
	"time"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
)

// dyingRuntime names the frames of functions that are alive; a function
// dies once the test says so, as V8 collects one nothing refers to.
type dyingRuntime struct {
	alive map[uint64]string
	reads int
}

func (d *dyingRuntime) Attach(*normalize.Process) {}
func (d *dyingRuntime) Forget(int)                {}
func (d *dyingRuntime) Name(_ int, f runtimes.Frame) (runtimes.Symbol, error) {
	d.reads++
	name, ok := d.alive[f.Ptr]
	if !ok {
		return runtimes.Symbol{}, errors.Join(errors.New("collected"), runtimes.ErrBadFrame)
	}
	return runtimes.Symbol{Frames: []pframe.Frame{{Name: name}}, Type: pframe.TypeV8JS}, nil
}

// batches is a Drainer handing out one batch per Drain.
type batches []sampler.Batch

func (b *batches) Drain() (sampler.Batch, error) {
	if len(*b) == 0 {
		return sampler.Batch{}, nil
	}
	out := (*b)[0]
	*b = (*b)[1:]
	return out, nil
}

// TestStageNamesEarly: frames drained by Stage are named then, while
// their functions live, and join the report Collect ends; a function that
// dies before its frames are drained stays unnamed, with its reason.
func TestStageNamesEarly(t *testing.T) {
	rt := &dyingRuntime{alive: map[uint64]string{0x1000: "top", 0x2000: "late"}}
	b := New(Options{Runtimes: rt})
	pid := uint32(os.Getpid())
	sample := func(fn uint64, n uint64) sampler.Sample {
		return sampler.Sample{
			Pid: pid, Tid: 1, Comm: "main", UserPCs: []uint64{sampler.RuntimeMark},
			Runtime: []runtimes.Frame{{Kind: 1, Ptr: fn}}, Count: n, FirstNs: time.Now().UnixNano(),
		}
	}
	d := &batches{
		{Samples: []sampler.Sample{sample(0x1000, 3)}},
		{Samples: []sampler.Sample{sample(0x1000, 2), sample(0x2000, 1)}},
	}
	start := time.Now()
	if err := b.Stage(d, start); err != nil {
		t.Fatal(err)
	}
	delete(rt.alive, 0x1000) // top returns and is collected
	delete(rt.alive, 0x2000) // late dies before its first drain
	rep, err := b.Collect(d, start)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Samples != 6 || rep.Rows != 2 {
		t.Fatalf("%d samples in %d rows, want 6 in 2: the staged row and the collected ones merge", rep.Samples, rep.Rows)
	}
	v := view{pd: rep.Profiles, dict: rep.Profiles.Dictionary()}
	got := map[string]int64{}
	for _, s := range v.samples(t, int(pid)) {
		name := v.function(s.locs[0])
		if name == "" {
			name = "unnamed: " + v.attrs(s.locs[0].AttributeIndices().AsRaw())[pframe.AttrError].(string)
		}
		got[name] += s.count
	}
	if got["top"] != 5 || got["unnamed: bad_runtime_frame"] != 1 || len(got) != 2 {
		t.Errorf("samples by frame name: %v, want top 5 (named when staged, the name kept) and 1 unnamed (bad_runtime_frame)", got)
	}
	if b.staged != nil {
		t.Error("Collect left a staged interval behind")
	}
}
