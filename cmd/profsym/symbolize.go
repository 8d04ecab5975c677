package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/elfx/buildid"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/lru"
	"github.com/profsym/profsym/internal/symbolize"
)

// target names an object: by path, or by GNU build id (hex).
type target struct {
	Path    string
	BuildID string
}

func (t target) String() string {
	if t.Path != "" {
		return t.Path
	}
	return "BUILDID:" + t.BuildID
}

// objects opens the files of a target the way the processor does, through
// a locate chain (the file itself, then the debug directories by build id
// and by .gnu_debuglink), and symbolizes them with the engine.
type objects struct {
	r     *symbolize.Resolver
	chain *locate.Chain
	// ids are the identities of the paths asked about, read once per file
	// version. A long-running caller (pprof keeps one process for a whole
	// session) may name any number of paths: the most recent are kept.
	ids *lru.Cache[string, pathID]
	// last is the handle of the previous answer's target, reused for up to
	// lastFor: input lines name the same object again and again, and
	// looking it up anew costs stats of every file on the chain per line
	// (a third of a cold run over 10,000 addresses). A file replaced in
	// place is seen again after lastFor.
	last struct {
		t    target
		h    *symbolize.Handle
		when time.Time
	}
}

// lastFor bounds how long a reused handle goes unchecked.
const lastFor = time.Second

// pathID is the identity read from a path, and the version of the file
// (size, modification time) it was read from.
type pathID struct {
	id    frame.Identity
	size  int64
	mtime time.Time
}

// maxPathIDs bounds objects.ids.
const maxPathIDs = 4096

func newObjects(opt symbolize.Options, debugDirs []string) *objects {
	chain := locate.New(locate.Options{Sources: []locate.Source{locate.Local{}, locate.DebugDirs{Dirs: debugDirs}}})
	opt.Supplementary = func(ctx context.Context, r symbolize.SupRequest) (string, error) {
		return chain.LocateSup(ctx, r.BuildID, r.Name, r.From, r.ByName)
	}
	opt.Split = func(ctx context.Context, r symbolize.SplitRequest) (string, error) {
		return chain.LocateSplit(ctx, r.Files, r.DWOName, r.CompDir)
	}
	// The files the chain opened to check them are handed to the engine,
	// as the processor does: a cold object is mapped once.
	opt.Open = func(ctx context.Context, path string, lim elfx.Limits) (*elfx.File, error) {
		if f := chain.TakeOpened(path); f != nil {
			return f, nil
		}
		return elfx.OpenContext(ctx, path, lim)
	}
	return &objects{
		r:     symbolize.New(opt),
		chain: chain,
		ids:   lru.New[string, pathID](0, maxPathIDs, nil, nil),
	}
}

func (o *objects) close() {
	o.forget()
	o.r.Close()
}

func (o *objects) forget() {
	if o.last.h != nil {
		o.last.h.Close()
		o.last.h = nil
	}
}

// handle returns the handle for t, to be used before the next call and not
// closed by the caller.
func (o *objects) handle(ctx context.Context, t target) (*symbolize.Handle, error) {
	if o.last.h != nil && o.last.t == t && time.Since(o.last.when) < lastFor {
		return o.last.h, nil
	}
	o.forget()
	h, err := o.open(ctx, t)
	if err != nil {
		return nil, err
	}
	o.last.t, o.last.h, o.last.when = t, h, time.Now()
	return h, nil
}

func (o *objects) open(ctx context.Context, t target) (*symbolize.Handle, error) {
	q := locate.Query{}
	if t.Path != "" {
		abs, err := filepath.Abs(t.Path)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(abs)
		if err != nil {
			return nil, err
		}
		p, ok := o.ids.Get(abs)
		if !ok || p.size != st.Size() || !p.mtime.Equal(st.ModTime()) {
			f, err := elfx.Open(abs)
			if err != nil {
				return nil, err
			}
			p = pathID{id: buildid.Identify(f), size: st.Size(), mtime: st.ModTime()}
			f.Close()
			o.ids.Add(abs, p)
		}
		q.ID = p.id
		q.AddHint(locate.Hint{File: abs})
	} else {
		id, err := frame.ParseBuildID(t.BuildID)
		if err != nil {
			return nil, err
		}
		q.ID.GNU = id
	}
	res, err := o.chain.Locate(ctx, q)
	if err != nil {
		return nil, err
	}
	bin, dbg := res.Paths()
	return o.r.Open(ctx, bin, dbg)
}

// funcFlag is llvm-symbolizer's --functions[=none|short|linkage]: a bare
// --functions (or -f) means linkage.
type funcFlag struct{ v string }

func (f *funcFlag) String() string   { return f.v }
func (f *funcFlag) IsBoolFlag() bool { return true }
func (f *funcFlag) Set(s string) error {
	switch s {
	case "true", "linkage":
		f.v = "linkage"
	case "short", "none":
		f.v = s
	case "false":
		f.v = "none"
	default:
		return fmt.Errorf("--functions takes none, short or linkage, not %q", s)
	}
	return nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

type symbolizeCmd struct {
	obj, buildID, style, adjust string
	inlines, noInlines          bool
	demangle, noDemangle        bool
	printAddr, useSymtab        bool
	functions                   funcFlag
	debugDirs                   listFlag
	vma                         uint64
	json                        bool
}

// runSymbolize implements `profsym symbolize`, a drop-in for the common uses
// of llvm-symbolizer (pprof's included). Only usage errors exit non-zero:
// a missing or corrupt file is reported per input and the tool goes on.
func runSymbolize(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &symbolizeCmd{functions: funcFlag{"linkage"}}
	fs := flag.NewFlagSet("profsym symbolize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, n := range []string{"obj", "exe", "e"} {
		fs.StringVar(&c.obj, n, "", "object file to symbolize (as --obj)")
	}
	fs.StringVar(&c.buildID, "build-id", "", "GNU build id (hex) of the object, looked up in the debug directories")
	fs.StringVar(&c.style, "output-style", "LLVM", "LLVM or JSON")
	for _, n := range []string{"inlines", "inlining", "i"} {
		fs.BoolVar(&c.inlines, n, true, "print inlined frames")
	}
	fs.BoolVar(&c.noInlines, "no-inlines", false, "print only the outermost function")
	for _, n := range []string{"demangle", "C"} {
		fs.BoolVar(&c.demangle, n, true, "demangle C++ and Rust names")
	}
	fs.BoolVar(&c.noDemangle, "no-demangle", false, "print mangled names")
	for _, n := range []string{"print-address", "addresses", "a"} {
		fs.BoolVar(&c.printAddr, n, false, "print the address before its frames")
	}
	fs.BoolVar(&c.useSymtab, "use-symbol-table", true, "name the outermost frame from the ELF symbol table")
	for _, n := range []string{"functions", "f"} {
		fs.Var(&c.functions, n, "function names: none, short or linkage")
	}
	fs.Var(&c.debugDirs, "debug-file-directory", "folder with .build-id/ debug files (repeatable)")
	fs.StringVar(&c.adjust, "adjust-vma", "0", "offset added to the object's addresses (lookups use ADDR-OFF)")

	// llvm-symbolizer accepts options after addresses.
	pos, err := parseArgs(fs, args)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		return 2
	}
	switch strings.ToUpper(c.style) {
	case "LLVM", "GNU":
	case "JSON":
		c.json = true
	default:
		fmt.Fprintf(stderr, "profsym symbolize: unknown --output-style %q (LLVM or JSON)\n", c.style)
		return 2
	}
	if c.vma, err = strconv.ParseUint(c.adjust, 0, 64); err != nil {
		fmt.Fprintf(stderr, "profsym symbolize: bad --adjust-vma %q\n", c.adjust)
		return 2
	}
	opt := symbolize.DefaultOptions()
	opt.Inlines = c.inlines && !c.noInlines
	opt.Demangle = c.demangle && !c.noDemangle
	opt.UseSymbolTable = c.useSymtab
	dirs := []string{debugdirs.DefaultDebugDir}
	if len(c.debugDirs) > 0 {
		dirs = append([]string(nil), c.debugDirs...)
	}
	r := newObjects(opt, dirs)
	defer r.close()
	ctx := context.Background()
	w := bufio.NewWriter(stdout)
	defer w.Flush()

	// The first batch opens the objects: the collector waits until it is
	// answered (a later batch, in a long session, runs with it on).
	releaseGC := holdGC()
	defer releaseGC()
	if len(pos) > 0 {
		// Addresses on the command line: one JSON array, like llvm.
		target := c.defaultTarget()
		var recs []jsonRecord
		for _, a := range pos {
			addr, perr := strconv.ParseUint(a, 0, 64)
			if perr != nil {
				c.writeText(w, target, a, nil, nil)
				continue
			}
			res := c.lookup(ctx, r, target, addr)
			if c.json {
				recs = append(recs, c.record(target, addr, res))
			} else {
				c.report(stderr, target, res.Err)
				c.writeText(w, target, a, &addr, res.Frames)
			}
		}
		if c.json {
			b, _ := json.Marshal(recs)
			w.Write(b)
			w.WriteByte('\n')
		}
		return 0
	}

	for batch := range c.inputBatches(stdin) {
		c.prefetch(ctx, r, batch)
		for _, in := range batch {
			if !in.ok {
				// llvm echoes lines it cannot parse; keep output aligned.
				fmt.Fprintln(w, in.line)
				continue
			}
			res := c.lookup(ctx, r, in.target, in.addr)
			if c.json {
				b, _ := json.Marshal(c.record(in.target, in.addr, res))
				w.Write(b)
				w.WriteByte('\n')
			} else {
				c.report(stderr, in.target, res.Err)
				c.writeText(w, in.target, in.addrStr, &in.addr, res.Frames)
			}
		}
		// pprof talks to us through a pipe, a line at a time, and waits
		// for each answer: answers go out whenever no more input is
		// waiting (llvm-symbolizer writes each answer on its own, 10,000
		// writes for 10,000 addresses).
		w.Flush()
		releaseGC()
	}
	return 0
}

func (c *symbolizeCmd) defaultTarget() target {
	return target{Path: c.obj, BuildID: c.buildID}
}

// parseInput splits a stdin line: "ADDR", "FILE ADDR", "BUILDID:HEX ADDR",
// optionally preceded by llvm's "CODE" or "DATA" command word.
func (c *symbolizeCmd) parseInput(line string) (target, string, bool) {
	fields := strings.Fields(line)
	if len(fields) > 0 && (fields[0] == "CODE" || fields[0] == "DATA") {
		fields = fields[1:]
	}
	switch len(fields) {
	case 1:
		return c.defaultTarget(), fields[0], true
	case 2:
		if id, ok := strings.CutPrefix(fields[0], "BUILDID:"); ok {
			return target{BuildID: id}, fields[1], true
		}
		return target{Path: strings.Trim(fields[0], `"`)}, fields[1], true
	}
	return target{}, "", false
}

type lookupResult struct {
	Frames []symbolize.Frame
	Err    error
}

func (c *symbolizeCmd) lookup(ctx context.Context, r *objects, t target, addr uint64) lookupResult {
	if t.Path == "" && t.BuildID == "" {
		return lookupResult{Err: fmt.Errorf("no object: give --obj, --build-id, or FILE ADDR")}
	}
	h, err := r.handle(ctx, t)
	if err != nil {
		return lookupResult{Err: err}
	}
	frames, err := h.Lookup(addr-c.vma, nil)
	if symbolize.IsUnresolved(err) {
		err = nil // an unknown address is "??", not an error
	}
	return lookupResult{Frames: frames, Err: err}
}

func (c *symbolizeCmd) report(stderr io.Writer, t target, err error) {
	if err != nil {
		fmt.Fprintf(stderr, "profsym symbolize: %s: %v\n", t, err)
	}
}

func (c *symbolizeCmd) name(f symbolize.Frame) string {
	switch c.functions.v {
	case "none":
		return ""
	case "short":
		return shortName(f.Function)
	}
	return f.Function
}

// writeText prints llvm-symbolizer's LLVM style: per frame a name line and a
// file:line:column line, then a blank line.
func (c *symbolizeCmd) writeText(w *bufio.Writer, t target, raw string, addr *uint64, frames []symbolize.Frame) {
	if c.printAddr {
		if addr != nil {
			fmt.Fprintf(w, "0x%x\n", *addr)
		} else {
			fmt.Fprintln(w, raw)
		}
	}
	if len(frames) == 0 {
		frames = []symbolize.Frame{{}}
	}
	for _, f := range frames {
		if c.functions.v != "none" {
			n := c.name(f)
			if n == "" {
				n = "??"
			}
			w.WriteString(n)
			w.WriteByte('\n')
		}
		file := f.File
		if file == "" {
			file = "??"
		}
		fmt.Fprintf(w, "%s:%d:%d\n", file, f.Line, f.Column)
	}
	w.WriteByte('\n')
}

type jsonSymbol struct {
	Column        uint32
	Discriminator uint32
	FileName      string
	FunctionName  string
	Line          uint32
	StartAddress  string
	StartFileName string
	StartLine     uint32
}

type jsonError struct {
	Message string
}

type jsonRecord struct {
	Address    string
	Error      *jsonError `json:",omitempty"`
	ModuleName string
	Symbol     []jsonSymbol `json:",omitempty"`
}

func (c *symbolizeCmd) record(t target, addr uint64, res lookupResult) jsonRecord {
	rec := jsonRecord{Address: fmt.Sprintf("0x%x", addr), ModuleName: t.Path}
	if t.Path == "" {
		rec.ModuleName = "BUILDID:" + t.BuildID
	}
	if res.Err != nil {
		rec.Error = &jsonError{Message: res.Err.Error()}
		return rec
	}
	frames := res.Frames
	if len(frames) == 0 {
		frames = []symbolize.Frame{{}}
	}
	for _, f := range frames {
		s := jsonSymbol{Column: f.Column, Discriminator: f.Discriminator, FileName: f.File,
			FunctionName: c.name(f), Line: f.Line, StartLine: f.StartLine, StartFileName: f.StartFile}
		// Every frame carries its own start, as llvm-symbolizer prints it
		// (see docs/symbolization.md for where the two still differ).
		if f.StartAddress != 0 {
			s.StartAddress = fmt.Sprintf("0x%x", f.StartAddress)
		}
		rec.Symbol = append(rec.Symbol, s)
	}
	return rec
}

// shortName drops namespaces and parameters: "ns::Box<int>::get(int) const"
// becomes "get", as llvm's --functions=short does.
func shortName(s string) string {
	depth := 0
	end := len(s)
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '<', '(':
			if depth == 0 && s[i] == '(' && i > 0 {
				end = i
				i = len(s)
				continue
			}
			depth++
		case '>', ')':
			depth--
		}
	}
	s = s[:end]
	depth = 0
	for i := len(s) - 1; i > 0; i-- {
		switch s[i] {
		case '>', ')':
			depth++
		case '<', '(':
			depth--
		case ':':
			if depth == 0 && s[i-1] == ':' {
				return s[i+1:]
			}
		}
	}
	return s
}
