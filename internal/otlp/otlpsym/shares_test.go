package otlpsym

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"runtime"
	"testing"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// A batch big enough to be cut into shares (one per core) comes out byte
// for byte as it does in one share: the dictionary's functions, reasons and
// mapping flags in the order a single pass writes them, cold and warm, with
// the same counts; frames without a mapping and other runtimes' frames
// among them.
func TestSharesKeepSerialOrder(t *testing.T) {
	bin := fixture(t, "otlpsym-shares")
	ids := idsOf(t, bin)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	f.Close()
	// 1,024 mappings of the binary (distinct locations need distinct
	// (mapping, address) pairs, and its text is small), mapping m with
	// addresses in part m/16 of the text: each share has functions first
	// used in it. Every 11th location is of a binary nobody has: a reason.
	const mappings, parts = 1024, 16
	batch := func() pprofile.Profiles {
		pd := pprofile.NewProfiles()
		d := pdict.New(pd.Dictionary())
		native := d.AttrStr(frame.AttrFrameType, frame.TypeNative)
		jvm := d.AttrStr(frame.AttrFrameType, "jvm")
		var locs []int32
		for m := range mappings {
			mi := d.Mapping(pdict.Mapping{Start: 0x1000 + uint64(m)<<20, Limit: 0x2000 + uint64(m)<<20, File: bin,
				Attrs: []int32{d.AttrStr(frame.AttrBuildIDGNU, ids.gnu)}})
			gone := d.Mapping(pdict.Mapping{Start: 0x1000 + uint64(m)<<20, Limit: 0x2000 + uint64(m)<<20, File: "/nonexistent",
				Attrs: []int32{d.AttrStr(frame.AttrBuildIDGNU, fmt.Sprintf("%040x", m+1))}})
			part := text.Size / parts
			lo := text.Addr + uint64(m*parts/mappings)*part
			for a := lo; a < lo+part; a++ {
				switch {
				case a%11 == 5:
					locs = append(locs, d.Location(pdict.Location{Mapping: gone, Address: a, Attrs: []int32{native}}))
					continue
				case a%13 == 7: // no mapping: a reason
					locs = append(locs, d.Location(pdict.Location{Address: a, Attrs: []int32{native}}))
					continue
				case a%17 == 3: // another runtime's frame: left alone
					locs = append(locs, d.Location(pdict.Location{Mapping: mi, Address: a, Attrs: []int32{jvm}}))
					continue
				}
				locs = append(locs, d.Location(pdict.Location{Mapping: mi, Address: a, Attrs: []int32{native}}))
			}
		}
		p := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
		for lo := 0; lo < len(locs); lo += 64 {
			s := p.Samples().AppendEmpty()
			s.SetStackIndex(d.Stack(locs[lo:min(lo+64, len(locs))]))
			s.Values().Append(1)
		}
		return pd
	}
	n := batch().Dictionary().LocationTable().Len()
	if n < 3*minShare {
		t.Fatalf("%d locations: too few for three shares (.text is %d bytes)", n, text.Size)
	}
	run := func(procs int) (cold, warm []byte, stCold, stWarm Stats) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		if got := shares(n); (procs == 1) != (got == 1) {
			t.Fatalf("GOMAXPROCS %d: %d shares", procs, got)
		}
		s := newSym(t, defaults())
		var m pprofile.ProtoMarshaler
		for k := range 2 {
			pd := batch()
			st := s.Profiles(context.Background(), pd)
			b, err := m.MarshalProfiles(pd)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				cold, stCold = b, st
			} else {
				warm, stWarm = b, st
			}
		}
		return
	}
	cold1, warm1, stCold1, stWarm1 := run(1)
	cold4, warm4, stCold4, stWarm4 := run(4)
	if stWarm1.Resolved == 0 || stWarm1.Unresolved["no_debug_info"] == 0 || stWarm1.Unresolved["no_mapping"] == 0 ||
		stWarm1.Skipped == 0 || stWarm1.CacheHits == 0 {
		t.Fatalf("the batch does not cover what it should: %+v", stWarm1)
	}
	if fmt.Sprint(stCold1) != fmt.Sprint(stCold4) || fmt.Sprint(stWarm1) != fmt.Sprint(stWarm4) {
		t.Errorf("counts differ: one share %+v / %+v, shares %+v / %+v", stCold1, stWarm1, stCold4, stWarm4)
	}
	if !bytes.Equal(cold1, cold4) {
		t.Errorf("cold batch differs between one share and several (%d vs %d bytes)", len(cold1), len(cold4))
	}
	if !bytes.Equal(warm1, warm4) {
		t.Errorf("warm batch differs between one share and several (%d vs %d bytes)", len(warm1), len(warm4))
	}
}
