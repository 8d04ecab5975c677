// Command fixture is a Go program with inlined helpers, generics, closures and
// methods, for symbolization tests.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

type point struct{ x, y int }

func (p point) add(q point) point { return point{p.x + q.x, p.y + q.y} }

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func manhattan(p, q point) int { return abs(p.x-q.x) + abs(p.y-q.y) }

func sum[T int | float64](xs []T) T {
	var s T
	for _, x := range xs {
		s += x
	}
	return s
}

//go:noinline
func hot(n int) int {
	pts := make([]point, 0, n)
	for i := 0; i < n; i++ {
		pts = append(pts, point{i * 7 % 13, i * 11 % 17}.add(point{1, 1}))
	}
	sort.Slice(pts, func(i, j int) bool { return manhattan(pts[i], point{}) < manhattan(pts[j], point{}) })
	ds := make([]int, len(pts))
	for i := range pts {
		ds[i] = manhattan(pts[i], pts[len(pts)-1-i])
	}
	return sum(ds)
}

//go:noinline
func words(s string) map[string]int {
	m := map[string]int{}
	for _, w := range strings.Fields(s) {
		m[strings.ToLower(w)]++
	}
	return m
}

func main() {
	n := 1000
	if len(os.Args) > 1 {
		fmt.Sscan(os.Args[1], &n)
	}
	fmt.Println(hot(n), len(words("the quick brown fox jumps over the lazy dog The End")), sum([]float64{1.5, 2.5}))
}
