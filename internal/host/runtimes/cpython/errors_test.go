package cpython

import (
	"testing"

	"github.com/profsym/profsym/bpf"
)

// Every reason the walker counts has a name: a new one in bpf/cpython.h
// without a name here would be reported as "unknown".
func TestErrorNames(t *testing.T) {
	var st bpf.ProfileCpythonCounters
	if n := len(st.Errors); n != int(bpf.ProfileCpythonErrorCPY_ERRORS) {
		t.Fatalf("%d error slots, enum cpython_error has %d", n, bpf.ProfileCpythonErrorCPY_ERRORS)
	}
	for i := range bpf.ProfileCpythonErrorCPY_ERRORS {
		if errorNames[i] == "" {
			t.Errorf("cpython_error %d has no name", i)
		}
	}
}
