// Sampler test fixture: spins in main.hot (via main.middle) until it has used
// the CPU seconds given as the first argument, or ten times that in wall time.
package main

import (
	"os"
	"strconv"
	"syscall"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var sink uint64

//go:noinline
func hot(n int) uint64 {
	var x uint64
	for i := 0; i < n; i++ {
		x = x*31 + (uint64(i) ^ (x >> 7))
	}
	return x
}

//go:noinline
func middle(n int) uint64 { return hot(n) + 1 }

func main() {
	secs := 3.0
	if len(os.Args) > 1 {
		secs, _ = strconv.ParseFloat(os.Args[1], 64)
	}
	d := time.Duration(secs * float64(time.Second))
	endCPU, endWall := cpuTime()+d, time.Now().Add(10*d)
	// The clocks are read every 8 calls: getrusage is a system call,
	// which an emulated VM makes costly next to the loop.
	for i := 0; i%8 != 0 || cpuTime() < endCPU && time.Now().Before(endWall); i++ {
		sink += middle(1000000)
	}
}
