//go:build linux && (amd64 || arm64)

package unwind

import "github.com/profsym/profsym/bpf"

// ExitStart returns pid's entry in the kernel's process map: its
// exit_start (set by the exit tracepoint) and whether it is there.
func ExitStart(m *Manager, pid int) (uint64, bool) {
	var v bpf.ProfileUnwindProc
	if err := m.maps.Procs.Lookup(uint32(pid), &v); err != nil {
		return 0, false
	}
	return v.ExitStart, true
}
