// Command fixture is a test program for internal/gopclntab: it exercises the
// kinds of inlining the Go compiler does (leaf helpers, mid-stack inlining,
// generics, closures, methods) next to functions kept out of line, so that
// the symbolizer's inline frames can be checked against DWARF.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

type point struct{ x, y int }

func (p point) add(q point) point { return point{p.x + q.x, p.y + q.y} }

func (p *point) scale(k int) { p.x *= k; p.y *= k }

func (p point) norm1() int { return abs(p.x) + abs(p.y) }

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// clamp and mix are small enough to inline into each other and into callers:
// mid-stack inlining gives chains three or four deep.
func clamp(v, lo, hi int) int {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

func mix(a, b int) int { return clamp(a*31+b, -1000000, 1000000) }

func mix3(a, b, c int) int { return mix(mix(a, b), c) }

type number interface{ ~int | ~int64 | ~float64 }

func sum[T number](xs []T) T {
	var s T
	for _, x := range xs {
		s += x
	}
	return s
}

func maxOf[T number](a, b T) T {
	if a > b {
		return a
	}
	return b
}

type stack[T any] struct{ items []T }

func (s *stack[T]) push(v T) { s.items = append(s.items, v) }

func (s *stack[T]) pop() (T, bool) {
	var zero T
	if len(s.items) == 0 {
		return zero, false
	}
	v := s.items[len(s.items)-1]
	s.items = s.items[:len(s.items)-1]
	return v, true
}

//go:noinline
func hot(n int) int {
	acc := 0
	for i := 0; i < n; i++ {
		p := point{i, -i}.add(point{1, 2})
		p.scale(3)
		acc = mix3(acc, p.norm1(), i)
	}
	return acc
}

//go:noinline
func generic(n int) float64 {
	ints := make([]int, n)
	fl := make([]float64, n)
	for i := range ints {
		ints[i] = i
		fl[i] = float64(i) / 3
	}
	return float64(sum(ints)) + maxOf(sum(fl), 1.5)
}

//go:noinline
func useStack(n int) int {
	var s stack[int]
	for i := 0; i < n; i++ {
		s.push(mix(i, n))
	}
	t := 0
	for {
		v, ok := s.pop()
		if !ok {
			break
		}
		t += v
	}
	return t
}

//go:noinline
func closures(words []string) string {
	count := 0
	bump := func(k int) { count += clamp(k, 0, 10) }
	for _, w := range words {
		bump(len(w))
	}
	sort.Slice(words, func(i, j int) bool { return len(words[i]) < len(words[j]) })
	up := func(s string) string { return strings.ToUpper(s) }
	return fmt.Sprintf("%d:%s", count, up(strings.Join(words, ",")))
}

type shape interface{ area() int }

type rect struct{ w, h int }

func (r rect) area() int { return r.w * r.h }

type square struct{ rect }

//go:noinline
func areas(ss []shape) int {
	t := 0
	for _, s := range ss {
		t = mix(t, s.area())
	}
	return t
}

//go:noinline
func recurse(n int) int {
	if n <= 1 {
		return abs(n)
	}
	return recurse(n-1) + mix(n, n)
}

func main() {
	n := len(os.Args) + 100
	fmt.Println(hot(n), generic(n), useStack(n))
	fmt.Println(closures([]string{"alpha", "be", "gamma", "d"}))
	fmt.Println(areas([]shape{rect{2, 3}, square{rect{4, 4}}}), recurse(10))
}
