// Command gotrace is the trace links fixture (internal/e2e
// TestCollectorTraceLinks, TestRecordTraceLinks): a Go program traced with
// the OpenTelemetry SDK, whose TracerProvider is wrapped by Grafana's
// otel-profiling-go, which puts each goroutine's trace_id and span_id in
// its pprof labels. It warms up until a line arrives on stdin, prints "go",
// then serves requests one after another on one locked thread: each a
// root span "request" with a child "compute" that spins in inSpan for
// spanCPU of thread CPU time, then spins in outside, in no span, for half
// that. Every span is printed as it ends ("span TRACE SPAN START END
// NAME", Unix ns), then "done"; it then waits to be killed. With a second
// argument "offcpu" the requests block instead of spinning: blockedInSpan
// and blockedOutside sleep in nanosleep(2) 5 ms at a time, for the same
// wall times, so the goroutine waits in a system call on its own thread.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	otelpyroscope "github.com/grafana/otel-profiling-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

const spanCPU = 100 * time.Millisecond

var sink atomic.Uint64

// printer writes every ended span to stdout.
type printer struct{ mu sync.Mutex }

func (*printer) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (p *printer) OnEnd(s sdktrace.ReadOnlySpan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sc := s.SpanContext()
	fmt.Printf("span %s %s %d %d %s\n", sc.TraceID(), sc.SpanID(), s.StartTime().UnixNano(), s.EndTime().UnixNano(), s.Name())
}

func (*printer) Shutdown(context.Context) error   { return nil }
func (*printer) ForceFlush(context.Context) error { return nil }

//go:noinline
func spin() {
	x := sink.Load()
	for i := 0; i < 100000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink.Store(x)
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

//go:noinline
func inSpan(cpu time.Duration) {
	for start := threadCPU(); threadCPU()-start < cpu; {
		spin()
	}
}

//go:noinline
func outside(cpu time.Duration) {
	for start := threadCPU(); threadCPU()-start < cpu; {
		spin()
	}
}

// block sleeps d in nanosleep(2) calls of 5 ms: a system call, so the
// thread waits with the goroutine on it.
func block(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(5 * time.Millisecond))
	for end := time.Now().Add(d); time.Now().Before(end); {
		_ = syscall.Nanosleep(&ts, nil)
	}
}

//go:noinline
func blockedInSpan(d time.Duration) { block(d) }

//go:noinline
func blockedOutside(d time.Duration) { block(d) }

//go:noinline
func warm(stop *atomic.Bool) {
	for !stop.Load() {
		spin()
	}
}

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	offCPU := len(os.Args) > 2 && os.Args[2] == "offcpu"
	runtime.GOMAXPROCS(2)
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(&printer{}))
	tracer := otelpyroscope.NewTracerProvider(sdk).Tracer("gotrace")
	var stop atomic.Bool
	go warm(&stop)
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	stop.Store(true)
	fmt.Println("go")
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		for range n {
			ctx, req := tracer.Start(context.Background(), "request")
			_, compute := tracer.Start(ctx, "compute")
			if offCPU {
				blockedInSpan(spanCPU)
			} else {
				inSpan(spanCPU)
			}
			compute.End()
			req.End()
			if offCPU {
				blockedOutside(spanCPU / 2)
			} else {
				outside(spanCPU / 2)
			}
		}
		close(done)
	}()
	<-done
	fmt.Println("done")
	for { // a select{} would be a deadlock the runtime ends
		time.Sleep(time.Hour)
	}
}
