package testfixture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
)

// LLVMFrame is one frame of llvm-symbolizer's JSON output.
type LLVMFrame struct {
	FunctionName  string
	FileName      string
	Line          uint32
	Column        uint32
	Discriminator uint32
	StartFileName string
	StartLine     uint32
	StartAddress  string
}

// LLVMSymbolize runs llvm-symbolizer-19 once over addrs (one per stdin
// line) with --obj=obj --output-style=JSON and args, and returns each
// address's frames, innermost first: the ground truth of the accuracy tests.
func LLVMSymbolize(t testing.TB, obj string, addrs []uint64, args ...string) [][]LLVMFrame {
	t.Helper()
	tool := NeedTool(t, "llvm-symbolizer-19")
	var in bytes.Buffer
	for _, a := range addrs {
		fmt.Fprintf(&in, "0x%x\n", a)
	}
	cmd := exec.Command(tool, append([]string{"--obj=" + obj, "--output-style=JSON"}, args...)...)
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	res := make([][]LLVMFrame, 0, len(addrs))
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var line struct {
			Address string
			Symbol  []LLVMFrame
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s output %q: %v", tool, sc.Text(), err)
		}
		res = append(res, line.Symbol)
	}
	if len(res) != len(addrs) {
		t.Fatalf("%s answered %d of %d addresses", tool, len(res), len(addrs))
	}
	return res
}
