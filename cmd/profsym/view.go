package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
	"github.com/profsym/profsym/internal/otlp/pdict"
)

// maxJFR bounds a compressed recording once expanded.
const maxJFR = 4 << 30

// readProfiles reads a profiles file: OTLP profiles JSON (one document, or
// the file exporter's one document per line), or a JFR recording (plain,
// or gzip/zstd/lz4 compressed), converted as the jfr receiver converts it.
func readProfiles(path string) ([]pprofile.Profiles, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		return nil, errNoProfiles(path)
	}
	// Regular files only: a FIFO or device named on the command line must
	// not block or be read.
	f, size, err := elfx.OpenRegular(path, maxJFR)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var head [4]byte
	n, _ := f.ReadAt(head[:], 0)
	if string(head[:n]) == "FLR\x00" {
		// Read chunk by chunk from the file: memory stays one chunk's.
		pd, _, err := jfrconv.Convert(f, size, jfrconv.Options{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return []pprofile.Profiles{pd}, nil
	}
	b, err := readAllBounded(f, path, maxProfileFile)
	if err != nil {
		return nil, err
	}
	if jfr.Detect(head[:n]) != jfr.None {
		if b, err = jfr.Decompress(b, maxJFR); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pd, _, err := jfrconv.ConvertBytes(b, jfrconv.Options{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return []pprofile.Profiles{pd}, nil
	}
	var um pprofile.JSONUnmarshaler
	var out []pprofile.Profiles
	docs := splitDocuments(b)
	if len(docs) == 0 {
		return nil, errNoProfiles(path)
	}
	for i, doc := range docs {
		pd, err := um.UnmarshalProfiles(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		out = append(out, pd)
	}
	return out, nil
}

// readAllBounded reads f (named path) whole, failing past limit bytes.
func readAllBounded(f io.Reader, path string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// symbolizeAll runs the processor's symbolizer over docs when asked.
func symbolizeAll(docs []pprofile.Profiles, on bool, sf *sourceFlags, stderr io.Writer, cmd string) bool {
	if !on {
		return true
	}
	sym, closeSym, err := sf.symbolizer()
	if err != nil {
		fmt.Fprintf(stderr, "profsym %s: %v\n", cmd, err)
		return false
	}
	defer closeSym()
	var total statsTotal
	for _, pd := range docs {
		total.add(sym.Profiles(context.Background(), pd))
	}
	total.print(stderr, cmd)
	return true
}

// parseArgs parses fs over args allowing flags after positional arguments.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

type fnStat struct {
	name      string
	flat, cum int64
}

// runTop implements `profsym top`: the hottest functions of a profiles file,
// like `perf report --stdio` or `pprof -top`.
func runTop(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("profsym top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 20, "rows to show")
	by := fs.String("by", "self", "sort by self (flat) or cumulative samples")
	pid := fs.Int("pid", 0, "only this process")
	typ := fs.String("type", "", "profile: cpu, off_cpu, wall, alloc, native (period or sample type, or the pprof name: cpu_samples...; default cpu when present, else the first)")
	tag := fs.String("tag", "", "only samples with this attribute value, KEY=VALUE (e.g. profsym.off_cpu.reason=futex)")
	stacksN := fs.Int("stacks", 5, "also show this many hottest stacks, leaf <- callers")
	symbolize := fs.Bool("symbolize", false, "symbolize raw native frames first, like profsym resolve")
	sources := addSourceFlags(fs)
	pos, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	tagKey, tagVal, tagged := strings.Cut(*tag, "=")
	if err != nil || len(pos) != 1 || (*by != "self" && *by != "cumulative") || (*tag != "" && (!tagged || tagKey == "")) {
		fmt.Fprintln(stderr, "usage: profsym top FILE [--n 20] [--by self|cumulative] [--pid N] [--type cpu|off_cpu|wall|alloc|native] [--tag KEY=VALUE] [--symbolize [resolve's source flags]]")
		return 2
	}
	docs, err := readProfiles(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "profsym top: %v\n", err)
		return 1
	}
	if !symbolizeAll(docs, *symbolize, sources, stderr, "top") {
		return 1
	}
	if *typ == "" {
		*typ = defaultType(docs)
	}
	stats := map[string]*fnStat{}
	paths := map[string]int64{}
	var total int64
	sel := selector{pid: *pid, typ: *typ, tagKey: tagKey, tagVal: tagVal}
	for _, pd := range docs {
		total += topOf(pd, sel, stats, paths)
	}
	val := valueFormat(unitOf(docs, *typ))
	rows := make([]*fnStat, 0, len(stats))
	for _, s := range stats {
		rows = append(rows, s)
	}
	slices.SortFunc(rows, func(a, b *fnStat) int {
		ka, kb := a.flat, b.flat
		if *by == "cumulative" {
			ka, kb = a.cum, b.cum
		}
		return cmp.Or(cmp.Compare(kb, ka), cmp.Compare(a.name, b.name))
	})
	if val.time() {
		fmt.Fprintf(stdout, "Total: %s", val.str(total))
	} else {
		fmt.Fprintf(stdout, "Samples: %d", total)
	}
	if *pid != 0 {
		fmt.Fprintf(stdout, " (pid %d)", *pid)
	}
	if *typ != "" {
		fmt.Fprintf(stdout, " (%s)", *typ)
	}
	if *tag != "" {
		fmt.Fprintf(stdout, " (%s)", *tag)
	}
	fmt.Fprintf(stdout, " in %s, sorted by %s\n", pos[0], *by)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "flat\tflat%\tsum%\tcum\tcum%\t \t")
	var sum int64
	for i, r := range rows {
		if i >= *n {
			break
		}
		sum += r.flat
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t \t%s\n", val.str(r.flat), pct(r.flat, total), pct(sum, total), val.str(r.cum), pct(r.cum, total), r.name)
	}
	tw.Flush()
	if *stacksN > 0 && len(paths) > 0 {
		type sp struct {
			path string
			n    int64
		}
		var ps []sp
		for p, n := range paths {
			ps = append(ps, sp{p, n})
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i].n > ps[j].n || ps[i].n == ps[j].n && ps[i].path < ps[j].path })
		fmt.Fprintln(stdout, "\nHottest stacks (leaf <- callers):")
		for i, p := range ps {
			if i >= *stacksN {
				break
			}
			fmt.Fprintf(stdout, "%8s %6s  %s\n", val.str(p.n), pct(p.n, total), p.path)
		}
	}
	return 0
}

// defaultType picks the profile top shows: cpu when any profile is a cpu
// profile, else the first profile's period type.
func defaultType(docs []pprofile.Profiles) string {
	first, seen := "", false
	for _, pd := range docs {
		st := pd.Dictionary().StringTable()
		str := func(i int32) string {
			if i <= 0 || int(i) >= st.Len() {
				return ""
			}
			return st.At(int(i))
		}
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					t := str(p.PeriodType().TypeStrindex())
					if t == "cpu" {
						return t
					}
					if !seen {
						first, seen = t, true
					}
				}
			}
		}
	}
	return first
}

// maxPathFrames bounds how much of a stack the hottest-stacks list shows.
const maxPathFrames = 8

func pct(a, b int64) string {
	if b == 0 {
		return "0.00%"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 2, 64) + "%"
}

// selector says which samples top counts.
type selector struct {
	pid            int
	typ            string // profile type, matched against period and sample types
	tagKey, tagVal string // an attribute the sample must have, when tagKey is set
}

// matchType reports whether profile p is of type typ (isType).
func matchType(d *pdict.Dict, p pprofile.Profile, typ string) bool {
	return isType(d.Str(p.PeriodType().TypeStrindex()), d.Str(p.SampleType().TypeStrindex()), typ)
}

// unitOf is the sample unit of the first profile of type typ.
func unitOf(docs []pprofile.Profiles, typ string) string {
	for _, pd := range docs {
		d := pdict.New(pd.Dictionary())
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					if matchType(d, p, typ) {
						return d.Str(p.SampleType().UnitStrindex())
					}
				}
			}
		}
	}
	return ""
}

// valueFormat prints values of a unit: durations for nanoseconds (off_cpu,
// wall), plain counts otherwise.
type valueFormat string

func (u valueFormat) time() bool { return u == "nanoseconds" }

func (u valueFormat) str(v int64) string {
	if !u.time() {
		return strconv.FormatInt(v, 10)
	}
	return time.Duration(v).Round(time.Microsecond).String()
}

// hasTag reports whether sample s carries attribute key with value val.
func hasTag(dict pprofile.ProfilesDictionary, d *pdict.Dict, s pprofile.Sample, key, val string) bool {
	for _, ai := range s.AttributeIndices().All() {
		if ai <= 0 || int(ai) >= dict.AttributeTable().Len() {
			continue
		}
		kv := dict.AttributeTable().At(int(ai))
		if d.Str(kv.KeyStrindex()) == key && kv.Value().AsString() == val {
			return true
		}
	}
	return false
}

// topOf adds one document's samples that sel selects to stats and paths,
// and returns their total.
func topOf(pd pprofile.Profiles, sel selector, stats map[string]*fnStat, paths map[string]int64) int64 {
	d := pdict.New(pd.Dictionary())
	dict := pd.Dictionary()
	locName := map[int32][]string{} // location -> names, innermost first
	names := func(li int32) []string {
		if v, ok := locName[li]; ok {
			return v
		}
		var out []string
		if li > 0 && int(li) < dict.LocationTable().Len() {
			loc := dict.LocationTable().At(int(li))
			for _, ln := range loc.Lines().All() {
				fi := ln.FunctionIndex()
				if fi > 0 && int(fi) < dict.FunctionTable().Len() {
					out = append(out, d.Str(dict.FunctionTable().At(int(fi)).NameStrindex()))
				}
			}
			if len(out) == 0 {
				// A frame nothing named counts for its binary, as pprof
				// shows "[liblzma.so.5.4.1]": one row per binary, not one
				// per address, so a hot stripped library stays in the top.
				file := "unknown"
				if mi := loc.MappingIndex(); mi > 0 && int(mi) < dict.MappingTable().Len() {
					if f := d.Str(dict.MappingTable().At(int(mi)).FilenameStrindex()); f != "" {
						file = filepath.Base(f)
					}
				}
				out = []string{file + " (no symbols)"}
			}
		}
		locName[li] = out
		return out
	}
	var total int64
	for _, rp := range pd.ResourceProfiles().All() {
		if sel.pid != 0 {
			if v, ok := rp.Resource().Attributes().Get(frame.AttrPID); !ok || v.Int() != int64(sel.pid) {
				continue
			}
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				if !matchType(d, p, sel.typ) {
					continue // another profile
				}
				for _, s := range p.Samples().All() {
					if sel.tagKey != "" && !hasTag(dict, d, s, sel.tagKey, sel.tagVal) {
						continue
					}
					v := sampleValue(s)
					total += v
					si := s.StackIndex()
					if si <= 0 || int(si) >= dict.StackTable().Len() {
						continue
					}
					seen := map[string]bool{}
					var path []string
					for i, li := range dict.StackTable().At(int(si)).LocationIndices().All() {
						if ns := names(li); len(path) < maxPathFrames && len(ns) > 0 {
							path = append(path, ns[len(ns)-1])
						}
						for j, name := range names(li) {
							st := stats[name]
							if st == nil {
								st = &fnStat{name: name}
								stats[name] = st
							}
							if i == 0 && j == 0 {
								st.flat += v
							}
							if !seen[name] {
								st.cum += v
								seen[name] = true
							}
						}
					}
					paths[strings.Join(path, " <- ")] += v
				}
			}
		}
	}
	return total
}

// isType reports whether a profile of that period and sample type is
// typ: its period type ("cpu", "wall"), its sample type or a prefix of it
// ("alloc" for alloc_space), or the name its pprof sample type gets
// ("cpu_samples", "wall_samples": profsym convert --to pprof).
func isType(period, sample, typ string) bool {
	switch {
	case typ == period, typ == sample, strings.HasPrefix(sample, typ+"_"):
		return true
	case period != "" && typ == period+"_"+sample:
		return true
	}
	return false
}

// sampleValue is a sample's count: its first value, else its number of
// timestamps, else one.
func sampleValue(s pprofile.Sample) int64 {
	if s.Values().Len() > 0 {
		return s.Values().At(0)
	}
	if n := s.TimestampsUnixNano().Len(); n > 0 {
		return int64(n)
	}
	return 1
}
