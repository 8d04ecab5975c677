package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"text/tabwriter"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/otlp/pdict"
	"github.com/profsym/profsym/internal/otlp/profbuild"
)

// readProfiles reads an OTLP profiles JSON file: one document, or the file
// exporter's one document per line.
func readProfiles(path string) ([]pprofile.Profiles, error) {
	b, err := readBounded(path, maxProfileFile)
	if err != nil {
		return nil, err
	}
	var um pprofile.JSONUnmarshaler
	var out []pprofile.Profiles
	for i, doc := range splitDocuments(b) {
		pd, err := um.UnmarshalProfiles(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		out = append(out, pd)
	}
	return out, nil
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
	pos, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil || len(pos) != 1 || (*by != "self" && *by != "cumulative") {
		fmt.Fprintln(stderr, "usage: profsym top FILE [--n 20] [--by self|cumulative] [--pid N]")
		return 2
	}
	docs, err := readProfiles(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "profsym top: %v\n", err)
		return 1
	}
	stats := map[string]*fnStat{}
	var total int64
	for _, pd := range docs {
		total += topOf(pd, *pid, stats)
	}
	rows := make([]*fnStat, 0, len(stats))
	for _, s := range stats {
		rows = append(rows, s)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		ka, kb := a.flat, b.flat
		if *by == "cumulative" {
			ka, kb = a.cum, b.cum
		}
		if ka != kb {
			return ka > kb
		}
		return a.name < b.name
	})
	fmt.Fprintf(stdout, "Samples: %d", total)
	if *pid != 0 {
		fmt.Fprintf(stdout, " (pid %d)", *pid)
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t \t%s\n", r.flat, pct(r.flat, total), pct(sum, total), r.cum, pct(r.cum, total), r.name)
	}
	tw.Flush()
	return 0
}

func pct(a, b int64) string {
	if b == 0 {
		return "0.00%"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 2, 64) + "%"
}

// topOf adds one document's samples to stats and returns their total.
func topOf(pd pprofile.Profiles, pid int, stats map[string]*fnStat) int64 {
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
				file := ""
				if mi := loc.MappingIndex(); mi > 0 && int(mi) < dict.MappingTable().Len() {
					file = filepath.Base(d.Str(dict.MappingTable().At(int(mi)).FilenameStrindex()))
				}
				out = []string{fmt.Sprintf("%#x [%s]", loc.Address(), file)}
			}
		}
		locName[li] = out
		return out
	}
	var total int64
	for _, rp := range pd.ResourceProfiles().All() {
		if pid != 0 {
			if v, ok := rp.Resource().Attributes().Get(frame.AttrPID); !ok || v.Int() != int64(pid) {
				continue
			}
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, s := range p.Samples().All() {
					v := sampleValue(s)
					total += v
					si := s.StackIndex()
					if si <= 0 || int(si) >= dict.StackTable().Len() {
						continue
					}
					seen := map[string]bool{}
					for i, li := range dict.StackTable().At(int(si)).LocationIndices().All() {
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
				}
			}
		}
	}
	return total
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

// runConvert implements `profsym convert FILE --to pprof -o OUT.pb.gz`.
func runConvert(args []string, _ io.Reader, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("profsym convert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	to := fs.String("to", "pprof", "output format: pprof")
	out := fs.String("o", "", "output file (gzipped profile.proto)")
	pos, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil || len(pos) != 1 || *to != "pprof" || *out == "" {
		fmt.Fprintln(stderr, "usage: profsym convert FILE --to pprof -o OUT.pb.gz")
		return 2
	}
	docs, err := readProfiles(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "profsym convert: %v\n", err)
		return 1
	}
	if len(docs) == 0 {
		fmt.Fprintf(stderr, "profsym convert: %s holds no profiles\n", pos[0])
		return 1
	}
	all := docs[0]
	for _, pd := range docs[1:] {
		if err := pd.MergeTo(all); err != nil {
			fmt.Fprintf(stderr, "profsym convert: merging documents: %v\n", err)
			return 1
		}
	}
	p, err := profbuild.ToPprof(all)
	if err != nil {
		fmt.Fprintf(stderr, "profsym convert: %v\n", err)
		return 1
	}
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintf(stderr, "profsym convert: %v\n", err)
		return 1
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		fmt.Fprintf(stderr, "profsym convert: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "wrote %s (%d samples); open with: go tool pprof -http=: %s\n", *out, len(p.Sample), *out)
	return 0
}
