//go:build linux && (amd64 || arm64)

package unwind

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/profsym/profsym/bpf"
)

// ExitStart returns the start time the exit tracepoint marked pid with
// (unwind_exits) and whether pid has an entry in the kernel's process map.
func ExitStart(m *Manager, pid int) (uint64, bool) {
	var v bpf.ProfileUnwindProc
	if err := m.maps.Procs.Lookup(uint32(pid), &v); err != nil {
		return 0, false
	}
	var start uint64
	_ = m.maps.Exits.Lookup(uint32(pid), &start)
	return start, true
}

// PlantDeadProcess makes pid's kernel entry look like that of a dead process
// whose exit userspace never handled (a lost event) and pid reused: marked
// exited with another start time, and pid not announced.
func PlantDeadProcess(m *Manager, pid int) error {
	if err := m.maps.Exits.Put(uint32(pid), uint64(12345)); err != nil {
		return err
	}
	if err := m.maps.Seen.Delete(uint32(pid)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}
