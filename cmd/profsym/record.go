package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/profsym/profsym/internal/debugdirs"
	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/otlp/profbuild"
)

// recordSources is record --symbolize's chain: the processor's sources of
// this host (the recorded processes, alive or not, their files,
// /usr/lib/debug) and, when urls (DEBUGINFOD_URLS) names servers, as
// Debian and Fedora hosts set it for their distribution's, debuginfod:
// stripped distribution binaries are then named by default.
func recordSources(urls string) (locate.Config, *debuginfod.Client, error) {
	lc := locate.Config{
		Order:     []string{locate.SourceProc, locate.SourceLocal, locate.SourceDebugDirs},
		DebugDirs: []string{debugdirs.DefaultDebugDir},
	}
	u := debuginfod.ParseURLs(urls)
	if len(u) == 0 {
		return lc, nil, nil
	}
	client, err := debuginfod.New(debuginfod.Config{URLs: u})
	if err != nil {
		return lc, nil, fmt.Errorf("debuginfod (%s): %w", debuginfod.EnvURLs, err)
	}
	lc.Order = append(lc.Order, locate.SourceDebuginfod)
	lc.Debuginfod = client
	return lc, client, nil
}

// pidList collects repeated --pid flags.
type pidList []int

func (p *pidList) String() string { return fmt.Sprint([]int(*p)) }

func (p *pidList) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return fmt.Errorf("not a process id: %q", s)
	}
	*p = append(*p, n)
	return nil
}

type recordOpts struct {
	duration     time.Duration
	pids         pidList
	comm         string
	rate         int
	symbolize    bool
	output       string
	format       string
	kernel       bool
	unwinding    unwind.Mode
	stackWords   int
	interpreters bool
	goLabels     bool
	threadCtx    bool
	filter       *profbuild.Filter
	offCPU       offcpu.Config
	wall         bool
}

func parseRecord(args []string, stderr io.Writer) (*recordOpts, error) {
	o := &recordOpts{}
	fs := flag.NewFlagSet("record", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: profsym record [--duration 10s] [--pid N]... [--comm REGEX] [--sample-rate 99] [--unwinding auto|frame_pointers] [--off-cpu [--off-cpu-probability P] [--off-cpu-min-wait D] [--wall]] [--symbolize] --output FILE [--format otlp-json|pprof]")
		fs.PrintDefaults()
	}
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to sample (Ctrl-C stops early)")
	fs.Var(&o.pids, "pid", "profile this process (repeatable); default: every process")
	fs.StringVar(&o.comm, "comm", "", "profile processes whose comm or executable name matches this regular expression")
	fs.IntVar(&o.rate, "sample-rate", 99, "samples per second per CPU")
	fs.BoolVar(&o.symbolize, "symbolize", false, "resolve native frames to functions, files and lines on this host")
	fs.StringVar(&o.output, "output", "", "file to write (required)")
	fs.StringVar(&o.format, "format", "otlp-json", "otlp-json (OTLP profiles JSON) or pprof (gzipped profile.proto)")
	fs.BoolVar(&o.kernel, "kernel", true, "record kernel stacks, named from /proc/kallsyms")
	fs.BoolVar(&o.goLabels, "go-labels", true, "put Go programs' pprof labels on their samples as pprof.label.<key> (needs -unwinding auto)")
	fs.BoolVar(&o.threadCtx, "thread-context", false, "link samples to the span their thread publishes in otel_thread_ctx_v1 (OpenTelemetry thread context, OTEP 4947; experimental; needs -unwinding auto)")
	fs.BoolVar(&o.interpreters, "interpreters", true, "follow and name Java (HotSpot), Python (CPython), Perl, PHP, Ruby and JavaScript (Node.js V8) frames in user stacks (needs -unwinding auto)")
	unwinding := fs.String("unwinding", "auto", "user stacks: auto (unwind tables from .eh_frame/.debug_frame/Go pcsp, frame pointers elsewhere) or frame_pointers")
	fs.IntVar(&o.stackWords, "max-stack-words", unwind.DefaultMaxStackWords, fmt.Sprintf("words of a walked user stack, up to %d: a native frame takes one, a Python, Java, ... frame two", unwind.MaxStackWords))
	fs.BoolVar(&o.offCPU.Enabled, "off-cpu", false, "also record where threads wait off CPU, and for how long (an off_cpu profile; --pid and --comm select whose)")
	fs.Float64Var(&o.offCPU.Probability, "off-cpu-probability", offcpu.DefaultProbability, "the least chance a wait has of being recorded (each counts its length divided by its chance)")
	fs.DurationVar(&o.offCPU.MinWait, "off-cpu-min-wait", 0, "leave out waits shorter than this")
	fs.BoolVar(&o.wall, "wall", false, "with --off-cpu, also a wall-clock profile: CPU and off-CPU time per thread in one")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.output == "":
		return nil, errors.New("--output is required")
	case o.format != "otlp-json" && o.format != "pprof":
		return nil, fmt.Errorf("--format must be otlp-json or pprof, not %q", o.format)
	case o.rate < 1 || o.rate > 1000:
		return nil, fmt.Errorf("--sample-rate must be between 1 and 1000, not %d", o.rate)
	case o.duration <= 0:
		return nil, errors.New("--duration must be positive")
	}
	var err error
	if o.unwinding, err = unwind.ParseMode(*unwinding); err != nil {
		return nil, fmt.Errorf("--unwinding: %w", err)
	}
	if o.offCPU.Enabled {
		o.offCPU.SetDefaults()
		if err := o.offCPU.Validate(); err != nil {
			return nil, fmt.Errorf("--off-cpu: %w", err)
		}
		if o.unwinding != unwind.ModeAuto {
			return nil, errors.New("--off-cpu needs --unwinding auto")
		}
	} else if o.wall {
		return nil, errors.New("--wall needs --off-cpu")
	}
	o.filter = &profbuild.Filter{}
	if len(o.pids) > 0 {
		o.filter.Targets = append(o.filter.Targets, profbuild.Target{PIDs: o.pids})
	}
	if o.comm != "" {
		t, err := profbuild.CompileTarget(nil, o.comm, "")
		if err != nil {
			return nil, fmt.Errorf("--comm: %w", err)
		}
		o.filter.Targets = append(o.filter.Targets, t)
	}
	if f := o.filter; o.offCPU.Enabled && !f.All() {
		// Waits of other processes are not even walked.
		o.offCPU.Select = func(pid int) bool { return f.MatchPID("", pid) }
	}
	return o, nil
}

func runRecord(args []string, _ io.Reader, _, stderr io.Writer) int {
	o, err := parseRecord(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "profsym record:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := record(ctx, o, stderr)
	// Ctrl-C ends the recording, not what follows it: symbolized under a
	// canceled ctx, every native frame stayed raw (timeout). A second
	// Ctrl-C still ends the process.
	stop()
	if err != nil {
		fmt.Fprintln(stderr, "profsym record:", err)
		return 1
	}
	if o.symbolize {
		lc, client, err := recordSources(os.Getenv(debuginfod.EnvURLs))
		if err != nil {
			fmt.Fprintln(stderr, "profsym record:", err)
			return 1
		}
		sym, err := otlpsym.New(otlpsym.Options{
			Demangle: true, Inlines: true, Lines: true, Locate: lc,
			// Downloads are waited for: the profile is written once.
			FetchWait: otlpsym.DefaultTimeout,
		})
		if err != nil {
			fmt.Fprintln(stderr, "profsym record:", err)
			return 1
		}
		st := sym.Profiles(context.Background(), rep.Profiles)
		sym.Close()
		if client != nil {
			client.Close()
		}
		raw := int64(0)
		for _, n := range st.Unresolved {
			raw += n
		}
		fmt.Fprintf(stderr, "profsym record: symbolized %d locations, %d left raw %v\n", st.Resolved, raw, st.Unresolved)
	}
	if err := writeProfiles(rep.Profiles, o.output, o.format); err != nil {
		fmt.Fprintln(stderr, "profsym record:", err)
		return 1
	}
	waits := ""
	if o.offCPU.Enabled {
		waits = fmt.Sprintf(" and %d waits off CPU (%v)", rep.OffCPUWaits, time.Duration(rep.OffCPUNs).Round(time.Millisecond))
	}
	fmt.Fprintf(stderr, "profsym record: %d samples%s of %d processes written to %s\n",
		rep.Samples, waits, rep.Profiles.ResourceProfiles().Len(), o.output)
	return 0
}

// record samples for o.duration (or until ctx ends) and builds one report.
// It says on stderr when the sampler runs: loading it can take seconds on
// a busy machine, and a run is only worth its samples from there.
func record(ctx context.Context, o *recordOpts, stderr io.Writer) (profbuild.Report, error) {
	s, err := sampler.New(sampler.Config{
		SampleRate: o.rate, KernelStacks: o.kernel, OffCPU: o.offCPU,
		Unwinding: unwind.Config{Mode: o.unwinding, MaxStackWords: o.stackWords},
		Runtimes: runtimes.Config{
			HotSpot: o.interpreters, CPython: o.interpreters, Perl: o.interpreters, PHP: o.interpreters, Ruby: o.interpreters, V8: o.interpreters,
			GoLabels: o.goLabels, MaxLabels: runtimes.DefaultMaxLabels, MaxLabelBytes: runtimes.DefaultMaxLabelBytes,
			ThreadContext: o.threadCtx,
		},
	})
	if err != nil {
		return profbuild.Report{}, err
	}
	defer s.Close()
	var unwinder profbuild.Unwinder
	if u := s.Unwinder(); u != nil {
		unwinder = u
	}
	var rts profbuild.Runtimes
	if rs := s.Runtimes(); rs != nil {
		rts = rs
	}
	b := profbuild.New(profbuild.Options{
		SampleRate: o.rate, KernelSymbols: o.kernel, PerfMaps: true, Wall: o.wall,
		Filter: o.filter, ScopeVersion: "profsym record", Unwinder: unwinder, Runtimes: rts, ExecTimes: s,
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range s.Events() {
			b.HandleEvent(ev)
		}
	}()
	start := time.Now()
	if err := s.Start(); err != nil {
		return profbuild.Report{}, err
	}
	fmt.Fprintf(stderr, "profsym record: sampling for %v (Ctrl-C stops)\n", o.duration)
	// While a runtime's processes are walked, their frames are named every
	// second, before the runtime frees what they point at (as the
	// receiver's interpreters.name_interval).
	names := time.NewTicker(time.Second)
	defer names.Stop()
	end := time.After(o.duration)
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-end:
			break wait
		case <-names.C:
			if s.Runtimes().Walking() > 0 {
				if err := b.Stage(s, start); err != nil {
					return profbuild.Report{}, err
				}
			}
		}
	}
	rep, err := b.Collect(s, start)
	s.Close()
	<-done
	return rep, err
}

func writeProfiles(pd pprofile.Profiles, path, format string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if format == "pprof" {
		var p interface{ Write(io.Writer) error }
		if p, err = profbuild.ToPprof(pd); err == nil {
			err = p.Write(f) // gzipped
		}
	} else {
		var b []byte
		if b, err = (&pprofile.JSONMarshaler{}).MarshalProfiles(pd); err == nil {
			_, err = f.Write(b)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
