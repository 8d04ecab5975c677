package profbuild

import (
	"fmt"
	"math"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	pframe "github.com/profsym/profsym/internal/frame"
)

// Mapping attributes the symbolizer sets (docs/frame-format.md).

// ToPprof converts OTLP profiles into one pprof profile: every process's
// samples, with process and thread attributes as labels.
//
// Mappings keep their file, build id and has_* flags, but are written as
// spanning the whole address space from 0: pprof's ELF tools treat such a
// mapping as "addresses already adjusted" and take location addresses as
// the ELF virtual addresses the frame format stores, so `go tool pprof`
// with the binaries at hand symbolizes raw frames correctly.
func ToPprof(pd pprofile.Profiles) (*profile.Profile, error) {
	c := &pprofConv{
		pd: pd, dict: pd.Dictionary(), out: &profile.Profile{},
		maps: map[int32]*profile.Mapping{}, locs: map[int32]*profile.Location{}, funcs: map[int32]*profile.Function{},
	}
	c.sampleTypes()
	for _, rp := range pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				if err := c.addProfile(rp.Resource(), p); err != nil {
					return nil, err
				}
			}
		}
	}
	if c.out.SampleType == nil {
		c.out.SampleType = []*profile.ValueType{{Type: "samples", Unit: "count"}}
	}
	return c.out, c.out.CheckValid()
}

type pprofConv struct {
	typeIdx map[[4]string]int // profile type -> index into SampleType
	pd      pprofile.Profiles
	dict    pprofile.ProfilesDictionary
	out     *profile.Profile
	maps    map[int32]*profile.Mapping
	locs    map[int32]*profile.Location
	funcs   map[int32]*profile.Function
}

func (c *pprofConv) str(i int32) string {
	if i <= 0 || int(i) >= c.dict.StringTable().Len() {
		return ""
	}
	return c.dict.StringTable().At(int(i))
}

func (c *pprofConv) typeKey(p pprofile.Profile) [4]string {
	return [4]string{
		c.str(p.SampleType().TypeStrindex()), c.str(p.SampleType().UnitStrindex()),
		c.str(p.PeriodType().TypeStrindex()), c.str(p.PeriodType().UnitStrindex()),
	}
}

// sampleTypes gives every distinct profile type (a JFR recording has cpu,
// wall and allocation profiles) a value index of its own, as pprof keeps
// several sample types side by side; types sharing a sample type name
// (samples/count over cpu and wall time) are told apart by the period's.
func (c *pprofConv) sampleTypes() {
	c.typeIdx = map[[4]string]int{}
	var keys [][4]string
	names := map[string]int{}
	for _, rp := range c.pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				k := c.typeKey(p)
				if _, ok := c.typeIdx[k]; ok {
					continue
				}
				if len(keys) == 0 {
					c.out.PeriodType = &profile.ValueType{Type: k[2], Unit: k[3]}
					c.out.Period = p.Period()
				}
				c.typeIdx[k] = len(keys)
				keys = append(keys, k)
				names[k[0]+"/"+k[1]]++
			}
		}
	}
	for _, k := range keys {
		vt := &profile.ValueType{Type: k[0], Unit: k[1]}
		// A count of samples is named by what was sampled (cpu_samples,
		// wall_samples: docs/jfr.md), as are types that would collide.
		if k[2] != "" && (k[0] == "samples" || names[k[0]+"/"+k[1]] > 1) {
			vt.Type = k[2] + "_" + k[0]
		}
		c.out.SampleType = append(c.out.SampleType, vt)
		// pprof opens the last type unless told: open the CPU profile.
		if k[2] == "cpu" && c.out.DefaultSampleType == "" {
			c.out.DefaultSampleType = vt.Type
		}
	}
}

func (c *pprofConv) addProfile(res pcommon.Resource, p pprofile.Profile) error {
	idx, n := c.typeIdx[c.typeKey(p)], len(c.out.SampleType)
	t := int64(p.Time())
	if c.out.TimeNanos == 0 || t < c.out.TimeNanos {
		c.out.TimeNanos = t
	}
	c.out.DurationNanos = max(c.out.DurationNanos, int64(p.DurationNano()))
	strLabels, numLabels := resourceLabels(res)
	for _, s := range p.Samples().All() {
		ps := &profile.Sample{Value: make([]int64, n), Label: map[string][]string{}, NumLabel: map[string][]int64{}}
		if s.Values().Len() > 0 {
			ps.Value[idx] = s.Values().At(0)
		} else {
			ps.Value[idx] = int64(max(s.TimestampsUnixNano().Len(), 1))
		}
		for k, v := range strLabels {
			ps.Label[k] = []string{v}
		}
		for k, v := range numLabels {
			ps.NumLabel[k] = []int64{v}
		}
		c.sampleLabels(s, ps)
		if int(s.StackIndex()) >= c.dict.StackTable().Len() {
			return fmt.Errorf("sample stack index %d out of range", s.StackIndex())
		}
		for _, li := range c.dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
			loc, err := c.location(li)
			if err != nil {
				return err
			}
			ps.Location = append(ps.Location, loc)
		}
		c.out.Sample = append(c.out.Sample, ps)
	}
	return nil
}

// resourceLabels turns the process's attributes into pprof labels.
func resourceLabels(res pcommon.Resource) (map[string]string, map[string]int64) {
	str, num := map[string]string{}, map[string]int64{}
	for k, v := range res.Attributes().All() {
		switch v.Type() {
		case pcommon.ValueTypeInt:
			num[k] = v.Int()
		default:
			str[k] = v.AsString()
		}
	}
	return str, num
}

func (c *pprofConv) sampleLabels(s pprofile.Sample, ps *profile.Sample) {
	for _, ai := range s.AttributeIndices().All() {
		if ai <= 0 || int(ai) >= c.dict.AttributeTable().Len() {
			continue
		}
		kv := c.dict.AttributeTable().At(int(ai))
		k := c.str(kv.KeyStrindex())
		if kv.Value().Type() == pcommon.ValueTypeInt {
			ps.NumLabel[k] = []int64{kv.Value().Int()}
		} else {
			ps.Label[k] = []string{kv.Value().AsString()}
		}
	}
}

func (c *pprofConv) location(i int32) (*profile.Location, error) {
	if l, ok := c.locs[i]; ok {
		return l, nil
	}
	if i <= 0 || int(i) >= c.dict.LocationTable().Len() {
		return nil, fmt.Errorf("location index %d out of range", i)
	}
	ol := c.dict.LocationTable().At(int(i))
	l := &profile.Location{ID: uint64(len(c.out.Location) + 1), Address: ol.Address()}
	if mi := ol.MappingIndex(); mi > 0 {
		m, err := c.mapping(mi)
		if err != nil {
			return nil, err
		}
		l.Mapping = m
	}
	for _, ln := range ol.Lines().All() {
		f, err := c.function(ln.FunctionIndex())
		if err != nil {
			return nil, err
		}
		l.Line = append(l.Line, profile.Line{Function: f, Line: ln.Line(), Column: ln.Column()})
	}
	c.out.Location = append(c.out.Location, l)
	c.locs[i] = l
	return l, nil
}

func (c *pprofConv) function(i int32) (*profile.Function, error) {
	if f, ok := c.funcs[i]; ok {
		return f, nil
	}
	if i <= 0 || int(i) >= c.dict.FunctionTable().Len() {
		return nil, fmt.Errorf("function index %d out of range", i)
	}
	of := c.dict.FunctionTable().At(int(i))
	f := &profile.Function{
		ID: uint64(len(c.out.Function) + 1), Name: c.str(of.NameStrindex()),
		SystemName: c.str(of.SystemNameStrindex()), Filename: c.str(of.FilenameStrindex()), StartLine: of.StartLine(),
	}
	c.out.Function = append(c.out.Function, f)
	c.funcs[i] = f
	return f, nil
}

func (c *pprofConv) mapping(i int32) (*profile.Mapping, error) {
	if m, ok := c.maps[i]; ok {
		return m, nil
	}
	if int(i) >= c.dict.MappingTable().Len() {
		return nil, fmt.Errorf("mapping index %d out of range", i)
	}
	om := c.dict.MappingTable().At(int(i))
	m := &profile.Mapping{
		ID: uint64(len(c.out.Mapping) + 1), Start: 0, Limit: math.MaxUint64,
		File: c.str(om.FilenameStrindex()),
	}
	var gnu, goID, htl string
	for _, ai := range om.AttributeIndices().All() {
		if ai <= 0 || int(ai) >= c.dict.AttributeTable().Len() {
			continue
		}
		kv := c.dict.AttributeTable().At(int(ai))
		switch c.str(kv.KeyStrindex()) {
		case pframe.AttrBuildIDGNU:
			gnu = kv.Value().Str()
		case pframe.AttrBuildIDGo:
			goID = kv.Value().Str()
		case pframe.AttrBuildIDHTL:
			htl = kv.Value().Str()
		case pframe.AttrHasFunctions:
			m.HasFunctions = kv.Value().Bool()
		case pframe.AttrHasFilenames:
			m.HasFilenames = kv.Value().Bool()
		case pframe.AttrHasLineNumbers:
			m.HasLineNumbers = kv.Value().Bool()
		case pframe.AttrHasInlineFrames:
			m.HasInlineFrames = kv.Value().Bool()
		}
	}
	m.BuildID = firstNonEmpty(gnu, goID, htl)
	c.out.Mapping = append(c.out.Mapping, m)
	c.maps[i] = m
	return m, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
