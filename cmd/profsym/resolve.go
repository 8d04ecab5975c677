package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debugdirs"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
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
	var urls, dirs, symdirs listFlag
	fs.Var(&urls, "debuginfod-url", "debuginfod server (repeatable; default DEBUGINFOD_URLS)")
	fs.Var(&dirs, "debug-file-directory", "folder with .build-id/ debug files (repeatable; default /usr/lib/debug)")
	fs.Var(&symdirs, "symbol-directory", "folder of binaries and debug files under any name (repeatable)")
	root := fs.String("root", "", "prefix for the profiled files' paths (e.g. a host mount)")
	cacheDir := fs.String("debuginfod-cache", "", "debuginfod download cache (default $XDG_CACHE_HOME/profsym/debuginfod)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on fetching and opening binaries")
	noDemangle := fs.Bool("no-demangle", false, "keep mangled names")
	noInlines := fs.Bool("no-inlines", false, "do not add inlined frames")
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

	opt := otlpsym.Options{Demangle: !*noDemangle, Inlines: !*noInlines, Lines: true, Timeout: *timeout,
		Logger: zap.NewNop(), Locate: locate.Config{LocalRoot: *root, DebugDirs: dirs, SymbolDirs: symdirs}}
	if len(opt.Locate.DebugDirs) == 0 {
		opt.Locate.DebugDirs = []string{debugdirs.DefaultDebugDir}
	}
	u := []string(urls)
	if len(u) == 0 {
		u = debuginfod.ParseURLs(os.Getenv(debuginfod.EnvURLs))
	}
	if len(u) > 0 {
		client, err := debuginfod.New(debuginfod.Config{URLs: u, Timeout: *timeout, CacheDir: *cacheDir})
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
			return 1
		}
		defer client.Close()
		opt.Locate.Debuginfod = client
	}
	sym, err := otlpsym.New(opt)
	if err != nil {
		fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
		return 1
	}
	defer sym.Close()

	var w io.Writer = stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
			return 1
		}
		defer f.Close()
		w = f
	}
	var total otlpsym.Stats
	var um pprofile.JSONUnmarshaler
	var mm pprofile.JSONMarshaler
	for i, doc := range splitDocuments(in) {
		pd, err := um.UnmarshalProfiles(doc)
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: document %d: %v\n", i+1, err)
			return 1
		}
		st := sym.Profiles(context.Background(), pd)
		total.Resolved += st.Resolved
		for k, v := range st.Unresolved {
			if total.Unresolved == nil {
				total.Unresolved = map[string]int64{}
			}
			total.Unresolved[k] += v
		}
		b, err := mm.MarshalProfiles(pd)
		if err != nil {
			fmt.Fprintf(stderr, "profsym resolve: %v\n", err)
			return 1
		}
		w.Write(b)
		io.WriteString(w, "\n")
	}
	fmt.Fprintf(stderr, "profsym resolve: %d frames resolved", total.Resolved)
	for k, v := range total.Unresolved {
		fmt.Fprintf(stderr, ", %d %s", v, k)
	}
	fmt.Fprintln(stderr)
	return 0
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
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
