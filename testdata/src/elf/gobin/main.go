// Command gobin is a Go fixture for build id tests.
package main

import "fmt"

func main() { fmt.Println("gobin") }
