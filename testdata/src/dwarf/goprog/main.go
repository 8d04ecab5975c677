// Command goprog is a dwarfsym test fixture: small functions the Go
// compiler inlines, several levels deep, plus closures and methods.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

type counter struct{ m map[string]int }

func (c *counter) add(k string) { c.m[k] += weight(k) }

func weight(s string) int {
	w := 0
	for i := 0; i < len(s); i++ {
		w += scale(int(s[i]))
	}
	return w
}

func scale(x int) int { return clamp(x*3, 0, 200) }

func clamp(x, lo, hi int) int {
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}

//go:noinline
func report(c *counter) string {
	keys := make([]string, 0, len(c.m))
	for k := range c.m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return c.m[keys[i]] < c.m[keys[j]] })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, c.m[k])
	}
	return b.String()
}

func main() {
	c := &counter{m: map[string]int{}}
	for _, a := range os.Args {
		for _, f := range strings.Fields(a) {
			c.add(f)
		}
	}
	fmt.Println(report(c))
}
