package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
)

// sourceFlags are the symbol-source flags of `profsym resolve`, shared by
// every command that symbolizes profiles (resolve, convert, top), so they
// all call the same symbolizer the same way.
type sourceFlags struct {
	urls, dirs, symdirs   listFlag
	root, cacheDir        *string
	timeout               *time.Duration
	noDemangle, noInlines *bool
}

func addSourceFlags(fs *flag.FlagSet) *sourceFlags {
	sf := &sourceFlags{}
	fs.Var(&sf.urls, "debuginfod-url", "debuginfod server (repeatable; default DEBUGINFOD_URLS)")
	fs.Var(&sf.dirs, "debug-file-directory", "folder with .build-id/ debug files (repeatable; default /usr/lib/debug)")
	fs.Var(&sf.symdirs, "symbol-directory", "folder of binaries and debug files under any name (repeatable)")
	sf.root = fs.String("root", "", "prefix for the profiled files' paths (e.g. a host mount)")
	sf.cacheDir = fs.String("debuginfod-cache", "", "debuginfod download cache (default $XDG_CACHE_HOME/profsym/debuginfod)")
	sf.timeout = fs.Duration("timeout", 30*time.Second, "bound on fetching and opening binaries")
	sf.noDemangle = fs.Bool("no-demangle", false, "keep mangled names")
	sf.noInlines = fs.Bool("no-inlines", false, "do not add inlined frames")
	return sf
}

// symbolizer builds the processor's symbolizer from the flags; close
// releases it and the debuginfod client.
func (sf *sourceFlags) symbolizer() (sym *otlpsym.Symbolizer, closeFn func(), err error) {
	// The processor's default chain: on the host where the profile was
	// taken, with its processes alive, proc names base-name mappings too.
	opt := otlpsym.Options{Demangle: !*sf.noDemangle, Inlines: !*sf.noInlines, Lines: true, Timeout: *sf.timeout,
		Logger: zap.NewNop(), Locate: locate.Config{LocalRoot: *sf.root, DebugDirs: sf.dirs, SymbolDirs: sf.symdirs}}
	if len(opt.Locate.DebugDirs) == 0 {
		opt.Locate.DebugDirs = []string{debugdirs.DefaultDebugDir}
	}
	u := []string(sf.urls)
	if len(u) == 0 {
		u = debuginfod.ParseURLs(os.Getenv(debuginfod.EnvURLs))
	}
	var client *debuginfod.Client
	if len(u) > 0 {
		client, err = debuginfod.New(debuginfod.Config{URLs: u, Timeout: *sf.timeout, CacheDir: *sf.cacheDir})
		if err != nil {
			return nil, nil, fmt.Errorf("debuginfod: %w", err)
		}
		opt.Locate.Debuginfod = client
	}
	sym, err = otlpsym.New(opt)
	if err != nil {
		if client != nil {
			client.Close()
		}
		return nil, nil, err
	}
	return sym, func() {
		sym.Close()
		if client != nil {
			client.Close()
		}
	}, nil
}

// output returns the file at path (created), or stdout when path is empty,
// and how to close it.
func output(path string, stdout io.Writer) (io.Writer, func(), error) {
	if path == "" {
		return stdout, func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { f.Close() }, nil
}

// statsTotal adds up what the symbolizer did over several documents.
type statsTotal struct{ otlpsym.Stats }

func (t *statsTotal) add(st otlpsym.Stats) {
	t.Resolved += st.Resolved
	for k, v := range st.Unresolved {
		if t.Unresolved == nil {
			t.Unresolved = map[string]int64{}
		}
		t.Unresolved[k] += v
	}
}

// print writes "profsym CMD: N frames resolved, M reason, ...".
func (t *statsTotal) print(w io.Writer, cmd string) {
	fmt.Fprintf(w, "profsym %s: %d frames resolved", cmd, t.Resolved)
	for k, v := range t.Unresolved {
		fmt.Fprintf(w, ", %d %s", v, k)
	}
	fmt.Fprintln(w)
}
