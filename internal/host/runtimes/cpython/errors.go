package cpython

import (
	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// errorNames are the walker's reasons (enum cpython_error), by value.
var errorNames = map[bpf.ProfileCpythonError]string{
	bpf.ProfileCpythonErrorCPY_ERR_NOT_ATTACHED: "not_attached",
	bpf.ProfileCpythonErrorCPY_ERR_REFUSED:      "refused",
	bpf.ProfileCpythonErrorCPY_ERR_NO_THREAD:    "no_thread",
	bpf.ProfileCpythonErrorCPY_ERR_READ:         "read",
	bpf.ProfileCpythonErrorCPY_ERR_READ_FRAME:   "read_frame",
	bpf.ProfileCpythonErrorCPY_ERR_READ_CODE:    "read_code",
	bpf.ProfileCpythonErrorCPY_ERR_NOT_CODE:     "not_code",
	bpf.ProfileCpythonErrorCPY_ERR_CHAIN_END:    "chain_end",
	bpf.ProfileCpythonErrorCPY_ERR_LOOP:         "loop",
}

// Errors returns the walker's failures so far, by reason, summed over
// CPUs (runtimes.WalkErrors).
func (r *Runtime) Errors() map[string]uint64 {
	st, err := r.WalkStats()
	if err != nil {
		return map[string]uint64{}
	}
	return runtimes.NameErrors(st.Errors[:], errorNames)
}

// Close closes the process memory files kept open for naming: the agent
// is stopping (a collector reload would otherwise leave up to
// maxOpenMems open per cycle, until the garbage collector finalized them).
func (r *Runtime) Close() error {
	r.mems.Close()
	return nil
}
