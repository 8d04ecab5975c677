package testfixture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// SplitSpec is a program built with -gsplit-dwarf: each source compiled
// on its own (so each has its .dwo), then linked, then, if Packer is set,
// its .dwo files packaged into BIN.dwp and removed.
type SplitSpec struct {
	Name     string
	Compiler string   // "g++", "clang++-19", ...
	Args     []string // compile flags (-gsplit-dwarf is added)
	Sources  []string // under testdata/src
	// Packer is "llvm-dwp-19" or "dwp" (binutils), or "" to keep the .dwo
	// files.
	Packer string
}

// SplitDWARF builds s once per content and returns the binary; its .dwo
// files, or BIN.dwp, lie beside it.
func SplitDWARF(t testing.TB, s SplitSpec) string {
	t.Helper()
	cc := NeedTool(t, s.Compiler)
	var packer string
	if s.Packer != "" {
		packer = NeedTool(t, s.Packer)
	}
	key := sha256.New()
	fmt.Fprintf(key, "%s\x00%q\x00%s\x00", s.Name, s.Args, s.Packer)
	for _, src := range s.Sources {
		hashTree(t, key, Src(t, src))
	}
	for _, tool := range []string{cc, packer} {
		if tool != "" {
			ver, _ := exec.Command(tool, "--version").CombinedOutput()
			key.Write(ver)
		}
	}
	hash := hex.EncodeToString(key.Sum(nil))[:20]
	final := filepath.Join(CacheDir(), hash, s.Name) // where Cached puts it
	dir := Cached(t, hash, s.Name, func(tmp string) {
		out := filepath.Join(tmp, s.Name)
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		var objs []string
		for i, src := range s.Sources {
			obj := fmt.Sprintf("%s-%d.o", s.Name, i)
			// DW_AT_comp_dir names the folder the fixture ends up in,
			// where the .dwo files are.
			args := append(append([]string{"-gsplit-dwarf", "-c", "-fdebug-prefix-map=" + out + "=" + final}, s.Args...),
				"-o", obj, Src(t, src))
			cmd := exec.Command(cc, args...)
			cmd.Dir = out // DW_AT_comp_dir: the .dwo files are written here
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, b)
			}
			objs = append(objs, filepath.Join(out, obj))
		}
		bin := filepath.Join(out, s.Name)
		cmd := exec.Command(cc, append(append([]string{"-o", bin}, objs...), s.Args...)...)
		cmd.Dir = out
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("linking %s: %v\n%s", s.Name, err, b)
		}
		for _, o := range objs {
			os.Remove(o)
		}
		if packer != "" {
			dwos, _ := filepath.Glob(filepath.Join(out, "*.dwo"))
			Run(t, packer, append([]string{"-o", bin + ".dwp"}, dwos...)...)
			for _, d := range dwos {
				os.Remove(d)
			}
		}
	})
	return filepath.Join(dir, s.Name)
}
