package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/elfx"
)

// maxProfileFile bounds what resolve reads into memory.
const maxProfileFile = 1 << 30

// runResolve implements `profsym resolve IN [-o OUT]`: the symbolization
// processor run offline over an OTLP profiles JSON file (as written by
// `profsym record` or the collector's file exporter, one JSON document per
// line).
func runResolve(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("profsym resolve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output file (default: standard output)")
	sources := addSourceFlags(fs)
	pos, err := parseArgs(fs, args) // flags may follow the input file
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: profsym resolve IN [-o OUT] [--debuginfod-url URL]... [--debug-file-directory DIR]...")
		return 2
	}
	var in []byte
	if pos[0] == "-" {
		in, err = io.ReadAll(io.LimitReader(stdin, maxProfileFile))
	} else {
		in, err = readBounded(pos[0], maxProfileFile)
	}
	if err != nil {
		fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
		return 1
	}
	docs := splitDocuments(in)
	if len(docs) == 0 {
		fmt.Fprintf(stderr, "profsym resolve: %v\n", errNoProfiles(pos[0]))
		return 1
	}

	sym, closeSym, err := sources.symbolizer()
	if err != nil {
		fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
		return 1
	}
	defer closeSym()

	w, closeOut, err := output(*out, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
		return 1
	}
	defer closeOut()
	var total statsTotal
	var um pprofile.JSONUnmarshaler
	var mm pprofile.JSONMarshaler
	for i, doc := range docs {
		pd, err := um.UnmarshalProfiles(doc)
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: document %d: %v\n", i+1, err)
			return 1
		}
		total.add(sym.Profiles(context.Background(), pd))
		b, err := mm.MarshalProfiles(pd)
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
			return 1
		}
		w.Write(b)
		io.WriteString(w, "\n")
	}
	total.print(stderr, "resolve")
	return 0
}

// errNoProfiles says what an empty input should have held (an empty file
// is not a corrupt ELF file, which is what opening it would say).
func errNoProfiles(path string) error {
	if path == "-" {
		path = "standard input"
	}
	return fmt.Errorf("%s is empty: want OTLP profiles JSON (what profsym record and the collector's file exporter write) or a JFR recording", path)
}

func readBounded(path string, limit int64) ([]byte, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		return nil, errNoProfiles(path)
	}
	f, _, err := elfx.OpenRegular(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllBounded(f, path, limit)
}

// splitDocuments splits the file exporter's JSON lines format; a single
// pretty-printed document is one document.
func splitDocuments(b []byte) [][]byte {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	docs := make([][]byte, 0, len(lines))
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			docs = append(docs, []byte(l))
		}
	}
	// A pretty-printed single document spans lines: detect by the first
	// line not closing itself.
	if len(docs) > 1 && !strings.HasSuffix(string(docs[0]), "}") {
		return [][]byte{[]byte(s)}
	}
	return docs
}
