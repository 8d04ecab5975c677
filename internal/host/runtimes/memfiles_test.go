package runtimes

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// fds counts this process's open files.
func fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testfixture.SkipOrFail(t, "no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// MemFiles keeps at most n memory files open, the least recently used
// closed first, and none after Forget or Close; a gone process is
// ErrProcessGone.
func TestMemFiles(t *testing.T) {
	var word uint64 = 0x1122334455667788
	// Started first: its handle (a pidfd) is a file of this process too.
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	before := fds(t)
	mf := NewMemFiles("", 1)
	self := os.Getpid()
	got, err := MemRead(mf, self, func(m *Mem) (uint64, error) { return m.U64(uint64(reflect.ValueOf(&word).Pointer())) })
	if err != nil || got != word {
		t.Fatalf("read %#x, %v", got, err)
	}
	if n := fds(t); n != before+1 {
		t.Errorf("%d files open, want %d", n, before+1)
	}
	// Another process's file takes the only place: ours is closed.
	if err := mf.Do(cmd.Process.Pid, func(*Mem) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n := fds(t); n != before+1 {
		t.Errorf("%d files open with room for one, want %d", n, before+1)
	}
	mf.Forget(cmd.Process.Pid)
	if n := fds(t); n != before {
		t.Errorf("%d files open after Forget, want %d", n, before)
	}
	mf.Do(self, func(*Mem) error { return nil })
	mf.Close()
	if n := fds(t); n != before {
		t.Errorf("%d files open after Close, want %d", n, before)
	}
	if err := mf.Do(1<<30, func(*Mem) error { return nil }); !errors.Is(err, ErrProcessGone) {
		t.Errorf("a pid that does not exist: %v", err)
	}
}

func TestNameErrors(t *testing.T) {
	got := NameErrors([]uint64{0, 3, 0, 5}, map[uint32]string{1: "read", 2: "loop"})
	if len(got) != 2 || got["read"] != 3 || got["unknown"] != 5 {
		t.Errorf("%v", got)
	}
}
