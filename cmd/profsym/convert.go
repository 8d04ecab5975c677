package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/otlp/profbuild"
)

// runConvert implements `profsym convert FILE --to pprof|otlp -o OUT`: an
// OTLP profiles JSON file or a JFR recording to pprof (go tool pprof opens
// it) or to OTLP profiles JSON (what the file exporter writes).
func runConvert(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("profsym convert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	to := fs.String("to", "pprof", "output format: pprof (gzipped profile.proto) or otlp (OTLP profiles JSON)")
	out := fs.String("o", "", "output file (otlp: default standard output)")
	symbolize := fs.Bool("symbolize", false, "symbolize raw native frames first, like profsym resolve")
	sources := addSourceFlags(fs)
	pos, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil || len(pos) != 1 || (*to != "pprof" && *to != "otlp") || (*to == "pprof" && *out == "") {
		fmt.Fprintln(stderr, "usage: profsym convert FILE --to pprof -o OUT.pb.gz | --to otlp [-o OUT.json] [--symbolize [resolve's source flags]]")
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
	if !symbolizeAll(docs, *symbolize, sources, stderr, "convert") {
		return 1
	}
	all := docs[0]
	for _, pd := range docs[1:] {
		if err := pd.MergeTo(all); err != nil {
			fmt.Fprintf(stderr, "profsym convert: merging documents: %v\n", err)
			return 1
		}
	}
	if *to == "otlp" {
		var m pprofile.JSONMarshaler
		b, err := m.MarshalProfiles(all)
		if err != nil {
			fmt.Fprintf(stderr, "profsym convert: %v\n", err)
			return 1
		}
		w, closeOut, err := output(*out, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "profsym convert: %v\n", err)
			return 1
		}
		defer closeOut()
		if _, err := w.Write(append(b, '\n')); err != nil {
			fmt.Fprintf(stderr, "profsym convert: %v\n", err)
			return 1
		}
		if *out != "" {
			fmt.Fprintf(stderr, "wrote %s (%s)\n", *out, otlpTotals(all))
		}
		return 0
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
	fmt.Fprintf(stderr, "wrote %s (%s); open with: go tool pprof -http=: %s\n", *out, pprofTotals(p), *out)
	return 0
}

// pprofTotals sums each sample type over the samples (a sample is one
// distinct stack and set of labels, its values the events it stands for):
// "cpu_samples 700, alloc_space 19312312 bytes; 3 stacks", the default
// type first.
func pprofTotals(p *profile.Profile) string {
	sums := make([]int64, len(p.SampleType))
	for _, s := range p.Sample {
		for i, v := range s.Value {
			if i < len(sums) {
				sums[i] += v
			}
		}
	}
	var parts []string
	for i, st := range p.SampleType {
		part := fmt.Sprintf("%s %d", st.Type, sums[i])
		if st.Unit != "count" && st.Unit != "" {
			part += " " + st.Unit
		}
		if st.Type == p.DefaultSampleType {
			parts = append([]string{part}, parts...)
		} else {
			parts = append(parts, part)
		}
	}
	return fmt.Sprintf("%s; %d stacks", strings.Join(parts, ", "), len(p.Sample))
}

// otlpTotals is pprofTotals over OTLP profiles, each profile type named as
// the pprof output names it.
func otlpTotals(pd pprofile.Profiles) string {
	st := pd.Dictionary().StringTable()
	str := func(i int32) string {
		if i <= 0 || int(i) >= st.Len() {
			return ""
		}
		return st.At(int(i))
	}
	type total struct {
		name, unit string
		sum        int64
	}
	var order []*total
	byName := map[string]*total{}
	n := 0
	for _, rp := range pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				name, unit := str(p.SampleType().TypeStrindex()), str(p.SampleType().UnitStrindex())
				if pt := str(p.PeriodType().TypeStrindex()); pt != "" && name == "samples" {
					name = pt + "_" + name
				}
				t := byName[name]
				if t == nil {
					t = &total{name: name, unit: unit}
					byName[name] = t
					order = append(order, t)
				}
				for _, s := range p.Samples().All() {
					t.sum += sampleValue(s)
					n++
				}
			}
		}
	}
	var parts []string
	for _, t := range order {
		part := fmt.Sprintf("%s %d", t.name, t.sum)
		if t.unit != "count" && t.unit != "" {
			part += " " + t.unit
		}
		parts = append(parts, part)
	}
	return fmt.Sprintf("%s; %d stacks", strings.Join(parts, ", "), n)
}
