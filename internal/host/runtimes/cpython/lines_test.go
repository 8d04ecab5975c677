package cpython

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

// TestLineTablesAgainstInterpreters decodes the line tables of every code
// object of a few stdlib modules (and the fixture) as each interpreter of
// the matrix writes them, and compares the line of every instruction with
// the one that interpreter gives (linedump.py).
func TestLineTablesAgainstInterpreters(t *testing.T) {
	for _, v := range Interpreters() {
		t.Run(v.Name, func(t *testing.T) {
			root := v.Root(t)
			paths := v.Copy(t, root, testfixture.Src(t, "runtimes/python/linedump.py"),
				testfixture.Src(t, "runtimes/python/chain.py"))
			cmd := v.Command(root, paths[0], paths[1], "json.decoder", "argparse", "typing", "dis")
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("linedump: %v", err)
			}
			format := map[int]lineFormat{6: linesLnotab, 7: linesLnotab, 8: linesLnotab, 9: linesLnotab, 10: linesTable310}[v.Minor]
			if format == 0 {
				format = linesLocations
			}
			codes, insts, bad := 0, 0, 0
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			sc.Buffer(nil, 16<<20)
			for sc.Scan() {
				var c struct {
					Name  string
					First int32
					Table string
					Lines []int32
				}
				if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
					t.Fatal(err)
				}
				table, err := hex.DecodeString(c.Table)
				if err != nil {
					t.Fatal(err)
				}
				codes++
				for i, want := range c.Lines {
					instr := int32(i)
					if format != linesLocations {
						instr = 2 * int32(i) // bytes
					}
					insts++
					if got := lineOf(format, table, c.First, instr); int32(got) != want {
						if bad++; bad <= 10 {
							t.Errorf("%s (first line %d): instruction %d at line %d, want %d", c.Name, c.First, i, got, want)
						}
					}
				}
			}
			t.Logf("%d code objects, %d instructions, %d lines differ", codes, insts, bad)
			if codes < 100 {
				t.Fatalf("only %d code objects dumped", codes)
			}
		})
	}
}

// FuzzLineOf: any table and instruction, no panic, a line within what the
// table can add to the first line.
func FuzzLineOf(f *testing.F) {
	f.Add(uint8(linesLocations), []byte{0xf0, 0x03, 0x01, 0x01, 0x01, 0xf8, 0x80, 0x00}, int32(1), int32(3))
	f.Add(uint8(linesLnotab), []byte{0x02, 0x01, 0x04, 0xff, 0x06, 0x80}, int32(10), int32(8))
	f.Add(uint8(linesLocations), []byte{0xf7, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f}, int32(1), int32(100))
	f.Fuzz(func(t *testing.T, format uint8, table []byte, first, instr int32) {
		_ = lineOf(lineFormat(format%3), table, first, instr)
	})
}
