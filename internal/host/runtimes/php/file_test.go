package php

import (
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestInspectDebian reads Debian's PHP executables (the e2e test's
// chroots): version, layout, executor_globals, execute_ex and its cold
// part, which every jump out of execute_ex lands in.
func TestInspectDebian(t *testing.T) {
	for _, c := range []struct{ suite, bin, minor string }{
		{"bookworm", "/usr/bin/php8.2", "8.2."},
		{"trixie", "/usr/bin/php8.4", "8.4."},
	} {
		root := testfixture.InterpreterChroot(t, "php", c.suite)
		f, err := elfx.Open(testfixture.ChrootFile(root, c.bin))
		if err != nil {
			t.Fatal(err)
		}
		fi := inspect(f, c.bin)
		f.Close()
		if fi.err != nil {
			t.Fatalf("%s: %v", c.bin, fi.err)
		}
		if fi.version[:4] != c.minor || fi.eg == 0 || fi.executeEx[1] <= fi.executeEx[0] {
			t.Errorf("%s: %+v", c.bin, fi)
		}
		if fi.cold[1] <= fi.cold[0] || fi.cold[1]-fi.cold[0] > 64<<10 || fi.cold[0] >= fi.executeEx[0] && fi.cold[0] < fi.executeEx[1] {
			t.Errorf("%s: cold part %#x (%v), execute_ex %#x", c.bin, fi.cold, fi.coldErr, fi.executeEx)
		}
		t.Logf("%s: PHP %s, executor_globals %#x, execute_ex %#x (%d bytes), cold part %#x (%d bytes)", c.bin, fi.version,
			fi.eg, fi.executeEx, fi.executeEx[1]-fi.executeEx[0], fi.cold, fi.cold[1]-fi.cold[0])
	}
}
