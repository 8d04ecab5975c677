//go:build !linux

package elfx

// sectionMemory is the Go heap where mremap is missing.
var sectionMemory memory = heapMemory{}
