// Command golabels is the Go pprof labels fixture (internal/e2e
// TestCollectorGoLabels, TestRecordGoLabels). It spins in warm until a
// line arrives on stdin (the profiler has seen it by then) and prints
// "go"; then two goroutines spin on their own threads for the CPU seconds
// given (CPU time, not wall time: a loaded machine gives fewer samples per
// second, not fewer samples): one in labelled, inside pprof.Do with the
// label request=a, the other in unlabelled, with no label. It prints
// "done" and waits to be killed, so that the label sets stay readable
// until the profiles are built.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

var sink atomic.Uint64

//go:noinline
func warm(stop *atomic.Bool) {
	for !stop.Load() {
		spin()
	}
}

//go:noinline
func labelled(cpu time.Duration) {
	runtime.LockOSThread()
	// From now: the thread may be the one warm ran on, with its time.
	for start := threadCPU(); threadCPU()-start < cpu; {
		spin()
	}
}

//go:noinline
func unlabelled(cpu time.Duration) {
	runtime.LockOSThread()
	// From now: the thread may be the one warm ran on, with its time.
	for start := threadCPU(); threadCPU()-start < cpu; {
		spin()
	}
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

//go:noinline
func spin() {
	x := sink.Load()
	for i := 0; i < 100000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink.Store(x)
}

func main() {
	secs, _ := strconv.Atoi(os.Args[1])
	runtime.GOMAXPROCS(2)
	var stop atomic.Bool
	go warm(&stop)
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	stop.Store(true)
	cpu := time.Duration(secs) * time.Second
	done := make(chan struct{}, 2)
	fmt.Println("go")
	go func() {
		pprof.Do(context.Background(), pprof.Labels("request", "a"), func(context.Context) {
			labelled(cpu)
		})
		done <- struct{}{}
	}()
	go func() {
		unlabelled(cpu)
		done <- struct{}{}
	}()
	<-done
	<-done
	fmt.Println("done")
	for { // a select{} would be a deadlock the runtime ends
		time.Sleep(time.Hour)
	}
}
