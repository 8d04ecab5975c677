// Command gowalk captures its own stack at the bottom of call chains of
// different shapes and prints, per chain, the raw stack bytes with the pc
// and sp to start from, and the runtime's own traceback (runtime.Callers).
// The unwind table tests walk the bytes with the table built from this
// binary and compare the frames with the runtime's.
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"unsafe"
)

func capture(buf []byte) (pc, sp uintptr)

type record struct {
	Chain   string
	PC, SP  uintptr
	Stack   string // hex bytes from SP
	Callers []string
}

var out []record

// top bounds the stack bytes to copy: a little above the outermost frame of
// interest, whose local it is given the address of.
func snap(name string, top uintptr) {
	buf := make([]byte, 1<<20)
	pc, sp := capture(buf) // buf is on the heap: the copy does not move the stack
	pcs := make([]uintptr, 128)
	n := runtime.Callers(1, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !more {
			break
		}
	}
	size := int(top - sp)
	if size < 0 || size > len(buf) {
		panic(fmt.Sprintf("bad stack bound %#x..%#x", sp, top))
	}
	out = append(out, record{Chain: name, PC: pc, SP: sp, Stack: hex.EncodeToString(buf[:size]), Callers: names})
}

//go:noinline
func leaf(name string, top uintptr) int {
	snap(name, top)
	return len(name)
}

//go:noinline
func small(name string, top uintptr, n int) int {
	if n > 0 {
		return small(name, top, n-1) + 1
	}
	return leaf(name, top)
}

//go:noinline
func bigFrame(name string, top uintptr) int {
	var a [20000]byte // a frame larger than the starting stack: it grows
	a[len(name)] = 1
	return leaf(name, top) + int(a[3])
}

type shape interface{ walk(string, uintptr) int }

type square struct{ side int }

//go:noinline
func (s *square) walk(name string, top uintptr) int { return bigFrame(name, top) * s.side }

//go:noinline
func generic[T any](v T, name string, top uintptr) int {
	var sh shape = &square{side: 2}
	return sh.walk(name, top) + len(fmt.Sprint(v))
}

//go:noinline
func withDefer(name string, top uintptr) (r int) {
	defer func() { r++ }()
	return closure(name, top)
}

//go:noinline
func closure(name string, top uintptr) int {
	f := func(k int) int { return small(name, top, k) }
	return f(3)
}

//go:noinline
func sorted(name string, top uintptr) int {
	v := []int{3, 1, 2}
	r := 0
	sort.Slice(v, func(i, j int) bool {
		if r == 0 {
			r = leaf(name, top)
		}
		return v[i] < v[j]
	})
	return r
}

// grow makes the goroutine's stack large enough for the chains up front,
// so that it does not move (and stale the bounds) while they run; with the
// collector off it does not shrink either.
//
//go:noinline
func grow(n int) int {
	var pad [16 << 10]byte
	pad[n%len(pad)] = byte(n)
	if n > 0 {
		return grow(n-1) + int(pad[7])
	}
	return int(pad[5])
}

func main() {
	debug.SetGCPercent(-1)
	grow(16)
	var anchor [64]byte
	top := uintptr(unsafe.Pointer(&anchor)) + 4096
	small("small", top, 5)
	generic(42, "generic", top)
	withDefer("defer", top)
	sorted("sort.Slice", top)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		grow(16)
		var anchor [64]byte
		top := uintptr(unsafe.Pointer(&anchor)) + 1024
		generic("x", "goroutine", top)
	}()
	wg.Wait()
	runtime.KeepAlive(anchor)
	enc := json.NewEncoder(os.Stdout)
	for _, r := range out {
		if err := enc.Encode(r); err != nil {
			panic(err)
		}
	}
}
