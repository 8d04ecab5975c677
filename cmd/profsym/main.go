// Command profsym is profsym's command-line tool: symbolize addresses like
// llvm-symbolizer, and (as the project grows) record, resolve and inspect
// profiles with the same engine the collector components use.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
)

type command struct {
	name, summary string
	run           func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"symbolize", "resolve addresses of an object to functions, files and lines (llvm-symbolizer compatible)", runSymbolize},
		{"record", "sample on-CPU (and off-CPU) stacks with eBPF and write OTLP profiles JSON or pprof", runRecord},
		{"resolve", "symbolize an OTLP profiles JSON file offline, like the symbolization processor", runResolve},
		{"top", "the hottest functions of a profiles file (like pprof -top)", runTop},
		{"convert", "convert a profiles file to pprof (go tool pprof opens it)", runConvert},
		{"upload", "upload the symbols of binaries to a profsym symbol store (for CI)", runUpload},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: profsym COMMAND [options]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}

func main() {
	// PROFSYM_CPUPROFILE=FILE profiles the tool itself (for development).
	if p := os.Getenv("PROFSYM_CPUPROFILE"); p != "" {
		if f, err := os.Create(p); err == nil {
			pprof.StartCPUProfile(f)
			code := run(dispatch(os.Args), os.Stdin, os.Stdout, os.Stderr)
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(code)
		}
	}
	os.Exit(run(dispatch(os.Args), os.Stdin, os.Stdout, os.Stderr))
}

// dispatch turns an invocation through a symlink named like a tool profsym
// stands in for into that command: pprof runs "llvm-symbolizer --inlining
// -demangle=false --output-style=JSON" from PATH, so a symlink named
// llvm-symbolizer (or llvm-symbolizer-19) to profsym serves it.
func dispatch(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	name := strings.TrimSuffix(filepath.Base(argv[0]), ".exe")
	if name == "llvm-symbolizer" || strings.HasPrefix(name, "llvm-symbolizer-") {
		return append([]string{"symbolize"}, argv[1:]...)
	}
	return argv[1:]
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdin, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "profsym: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}
