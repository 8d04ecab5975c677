//go:build linux

package elfx_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// envChild makes the test binary a child that opens one hostile file, reads
// every section and prints its peak RSS, so the parent measures the real
// resident memory of that work alone.
const envChild = "PROFSYM_ELFX_RSS_CHILD"

// TestHostileFileRSS opens ZIP-bomb-style ELF files in a child process and
// checks its peak RSS (VmHWM): it stays within the decompression limit,
// whatever the headers claim (sections grow in place with mremap, so there
// is no second copy at the peak).
func TestHostileFileRSS(t *testing.T) {
	if p := os.Getenv(envChild); p != "" {
		rssChild(p)
		return
	}
	const mib = 1 << 20
	cases := []struct {
		name         string
		claim, real  int64
		wantReadable int
	}{
		// The F6 file: three zlib sections each claiming 2 GiB.
		{"three 2 GiB claims", 2 << 30, 1 * mib, 0},
		// Streams that really expand to what they claim: 3 x 200 MiB
		// against the default 512 MiB per file.
		{"three real 200 MiB bombs", 200 * mib, 200 * mib, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var secs []testfixture.Section
			for _, name := range []string{".debug_info", ".debug_line", ".debug_str"} {
				secs = append(secs, testfixture.CompressedSection(t, name, elf.COMPRESS_ZLIB, c.claim, c.real))
			}
			p := write(t, "bomb", testfixture.BuildELF(secs...))
			cmd := exec.Command(os.Args[0], "-test.run=^TestHostileFileRSS$")
			cmd.Env = append(os.Environ(), envChild+"="+p)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var hwm int64
			var readable int
			for _, line := range strings.Split(string(out), "\n") {
				fmt.Sscanf(line, "hwm_kib=%d readable=%d", &hwm, &readable)
			}
			hwm <<= 10
			t.Logf("%s: peak RSS %d MiB, %d of 3 sections decoded, %v (child process)", c.name, hwm>>20, readable, took)
			if readable != c.wantReadable {
				t.Errorf("%d sections decoded, want %d", readable, c.wantReadable)
			}
			// A test binary idles at ~10 MiB.
			if limit := int64(elfx.DefaultMaxDecompressedBytes + 64*mib); hwm > limit {
				t.Errorf("peak RSS %d MiB, more than %d MiB", hwm>>20, limit>>20)
			}
		})
	}
}

func rssChild(path string) {
	f, err := elfx.Open(path)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	readable := 0
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_COMPRESSED == 0 {
			continue
		}
		if _, err := f.SectionData(s.Name); err == nil {
			readable++
		}
	}
	fmt.Printf("hwm_kib=%d readable=%d\n", vmHWM(), readable)
	os.Exit(0)
}

// vmHWM is this process's peak resident set in KiB.
func vmHWM() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
