package runtimes

import "runtime"

// UserTop is where user addresses end, for the walkers' checks of pointers
// a process holds: 47 bits on x86-64 (4-level paging; 5-level hands out more
// only to a process that asks), 48 on arm64.
var UserTop = map[string]uint64{"amd64": 1 << 47, "arm64": 1 << 48}[runtime.GOARCH]
