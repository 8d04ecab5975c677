package profbuild

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/symbolize"
)

// pframe.AttrError says why a location stayed raw.

var reasons = []error{pframe.ErrNoDebugInfo, pframe.ErrBuildIDMismatch, pframe.ErrFetchFailed,
	pframe.ErrTimeout, pframe.ErrCorruptFile, pframe.ErrNotFound}

// SymbolizeHost fills in the lines of raw native locations of profiles
// recorded on this host, opening each file through its process's root
// (/proc/PID/root, right for containers) while the process lives and by
// its path otherwise, checked against the mapping's GNU build id. It
// returns how many locations were resolved and left raw; locations left
// raw get pframe.AttrError.
func SymbolizeHost(ctx context.Context, pd pprofile.Profiles, r *symbolize.Resolver) (resolved, failed int) {
	d := pdict.New(pd.Dictionary())
	pids := mappingPIDs(d, pd)
	byMap := map[int32][]int32{}
	locs := d.D.LocationTable()
	for i := 1; i < locs.Len(); i++ {
		l := locs.At(i)
		if l.Lines().Len() > 0 || l.MappingIndex() <= 0 {
			continue
		}
		if v, ok := d.FindAttr(l.AttributeIndices(), pframe.AttrFrameType); ok && v.Str() != pframe.TypeNative {
			continue
		}
		byMap[l.MappingIndex()] = append(byMap[l.MappingIndex()], int32(i))
	}
	var frames []symbolize.Frame
	for mi, li := range byMap {
		m := d.D.MappingTable().At(int(mi))
		file := d.Str(m.FilenameStrindex())
		if file == "" || strings.HasPrefix(file, "[") {
			continue // [jit], [vdso]: nothing to open
		}
		id := ""
		if v, ok := d.FindAttr(m.AttributeIndices(), pframe.AttrBuildIDGNU); ok {
			id = v.Str()
		}
		h, err := r.Open(ctx, symbolize.Target{Path: hostPath(pids[mi], file), BuildID: id})
		inlines, named := false, 0
		for _, i := range li {
			l := locs.At(int(i))
			if err == nil {
				frames, err = h.Lookup(l.Address(), frames[:0])
			}
			if err != nil {
				l.AttributeIndices().Append(d.AttrStr(pframe.AttrError, reason(err)))
				failed++
				if h != nil {
					err = nil // only this address is unresolved
				}
				continue
			}
			for _, f := range frames {
				fn := d.Function(f.Function, f.Name, f.File, int64(f.StartLine))
				ln := l.Lines().AppendEmpty()
				ln.SetFunctionIndex(fn)
				ln.SetLine(int64(f.Line))
				ln.SetColumn(int64(f.Column))
			}
			inlines = inlines || len(frames) > 1
			named++
			resolved++
		}
		if h != nil {
			h.Close()
		}
		if named > 0 {
			m.AttributeIndices().Append(d.AttrBool(pframe.AttrHasFunctions, true), d.AttrBool(pframe.AttrHasFilenames, true),
				d.AttrBool(pframe.AttrHasLineNumbers, true), d.AttrBool(pframe.AttrHasInlineFrames, inlines))
		}
	}
	return resolved, failed
}

// mappingPIDs finds, for each mapping, a process that used it.
func mappingPIDs(d *pdict.Dict, pd pprofile.Profiles) map[int32]int64 {
	out := map[int32]int64{}
	for _, rp := range pd.ResourceProfiles().All() {
		v, ok := rp.Resource().Attributes().Get(pframe.AttrPID)
		if !ok {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, s := range p.Samples().All() {
					if s.StackIndex() <= 0 || int(s.StackIndex()) >= d.D.StackTable().Len() {
						continue
					}
					for _, li := range d.D.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						out[d.D.LocationTable().At(int(li)).MappingIndex()] = v.Int()
					}
				}
			}
		}
	}
	return out
}

func hostPath(pid int64, file string) string {
	if pid > 0 {
		p := filepath.Join("/proc", strconv.FormatInt(pid, 10), "root", file)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return file
}

func reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	if symbolize.IsUnresolved(err) {
		return pframe.ErrNoDebugInfo.Error()
	}
	return pframe.ErrNotFound.Error()
}
