//go:build linux

package testfixture

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"syscall"
	"time"
)

// Cost is what running a function cost this process. CPU and Alloc do not
// depend on what else the machine runs (wall-clock percentages on a shared
// machine do); RSSPeak is the kernel's own high-water mark.
type Cost struct {
	CPU      time.Duration // user+system CPU of the whole process: GC and helper goroutines included
	Alloc    uint64        // bytes allocated on the Go heap
	HeapPeak uint64        // MeasureHeap: high-water of heap objects (live and not yet swept) above the level before, sampled every 250 µs
	RSSPeak  uint64        // high-water of the resident set (anonymous and file pages) above the level before
}

// Add sums two costs; peaks take the larger.
func (c Cost) Add(o Cost) Cost {
	return Cost{CPU: c.CPU + o.CPU, Alloc: c.Alloc + o.Alloc, HeapPeak: max(c.HeapPeak, o.HeapPeak), RSSPeak: max(c.RSSPeak, o.RSSPeak)}
}

// Measure runs fn and returns its cost. It first collects garbage, so that
// fn does not pay for earlier garbage. Other goroutines of the process count
// too: keep the process otherwise idle.
func Measure(fn func()) Cost { return measure(fn, false) }

// MeasureHeap is Measure plus the peaks: it also returns free memory to the
// OS before fn, so that the RSS peak is what fn itself makes resident (fn
// then pays the page faults of its heap), resets the kernel's RSS
// high-water mark (/proc/self/clear_refs), and samples the heap with a
// goroutine polling runtime/metrics (about 1% of a core while fn runs).
func MeasureHeap(fn func()) Cost { return measure(fn, true) }

func measure(fn func(), heap bool) Cost {
	if heap {
		debug.FreeOSMemory()
	} else {
		runtime.GC()
	}
	ResetPeakRSS()
	rss0 := StatusBytes("VmRSS")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms) // exact, unlike runtime/metrics' allocs, which per-P caches delay
	alloc0, heap0 := ms.TotalAlloc, ms.HeapAlloc

	var peak uint64
	stop, done := make(chan struct{}), make(chan struct{})
	if heap {
		go func() {
			defer close(done)
			s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
			for {
				metrics.Read(s)
				peak = max(peak, s[0].Value.Uint64())
				select {
				case <-stop:
					return
				default:
					time.Sleep(250 * time.Microsecond)
				}
			}
		}()
	} else {
		close(done)
	}
	cpu0 := ProcessCPU()
	fn()
	cpu := ProcessCPU() - cpu0
	close(stop)
	<-done

	runtime.ReadMemStats(&ms)
	c := Cost{CPU: cpu, Alloc: ms.TotalAlloc - alloc0}
	if heap {
		peak = max(peak, ms.HeapAlloc)
		if peak > heap0 {
			c.HeapPeak = peak - heap0
		}
	}
	if hwm := StatusBytes("VmHWM"); hwm > rss0 {
		c.RSSPeak = hwm - rss0
	}
	return c
}

// ResetPeakRSS resets VmHWM of /proc/self/status to the current RSS.
func ResetPeakRSS() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// StatusBytes reads a "kB" field of /proc/self/status (VmRSS, VmHWM,
// RssAnon, RssFile), in bytes; 0 when absent.
func StatusBytes(key string) uint64 {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(s, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(key+":")); ok {
			kb, _ := strconv.ParseUint(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(v), []byte("kB")))), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ProcessCPU is this process's user+system time, all threads.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
