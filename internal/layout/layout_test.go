package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

const module = "github.com/profsym/profsym/"

// stages maps a package (by path prefix, most specific first) to its stage.
// Packages under no prefix (cmd/, receiver/, processor/, extension/,
// deploy/, internal/e2e) are the top: they may import anything.
var stages = []struct{ prefix, stage string }{
	{"internal/e2e", "top"},
	{"internal/frame", "frame"},
	{"internal/host", "host"},
	{"bpf", "host"},
	{"internal/otlp", "otlp"},
	{"internal/locate", "locate"},
	{"internal/symbolize", "symbolize"},
	{"internal/symstore", "store"},
	{"internal/jfr", "jfr"},
	{"internal", "shared"}, // elfx, addrmap, gopclntab, debugdirs, filever, lru, testfixture
}

// may lists the other stages a stage's packages may import, besides their
// own stage and "shared" (which every stage but frame may import). otlp/
// adapts pdata over the stages; locate/ may use the engine, never the other
// way round; host/symupload is the symbol store's client; frame/ imports
// nothing from this module.
var may = map[string][]string{
	"shared":    nil,
	"host":      {"store"},
	"jfr":       nil,
	"store":     nil,
	"symbolize": nil,
	"locate":    {"symbolize"},
	"otlp":      {"host", "jfr", "locate", "symbolize"},
}

func stageOf(pkg string) string {
	for _, s := range stages {
		if pkg == s.prefix || strings.HasPrefix(pkg, s.prefix+"/") {
			return s.stage
		}
	}
	return "top"
}

// allowed reports whether a package of stage from may import a package of
// stage to.
func allowed(from, to string) bool {
	switch {
	case from == "top":
		return true
	case from == "frame":
		return false
	case to == "top":
		return false
	case from == to || to == "shared" || to == "frame":
		return true
	}
	return slices.Contains(may[from], to)
}

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		want     bool
	}{
		{"internal/host/unwind/table", "internal/gopclntab", true},
		{"internal/host/unwind/table", "internal/symbolize/gopclntab", false},
		{"internal/host/symupload", "internal/locate/debugdirs", false},
		{"internal/host/symupload", "internal/symstore", true},
		{"internal/symbolize", "internal/locate", false},
		{"internal/dwarf", "internal/host/unwind", false},
		{"internal/locate", "internal/dwarf", true},
		{"internal/otlp/otlpsym", "internal/locate", true},
		{"internal/frame", "internal/elfx", false},
		{"internal/elfx", "internal/frame", true},
		{"internal/elfx", "internal/symbolize", false},
		{"internal/lru", "receiver/profilingreceiver", false},
		{"cmd/profsym", "internal/host/sampler", true},
		{"internal/e2e", "internal/host/sampler", true},
	} {
		if got := allowed(stageOf(tc.from), stageOf(tc.to)); got != tc.want {
			t.Errorf("%s -> %s: allowed %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestImportsFollowDataPath reads the imports of every non-test Go file of
// the module, every GOOS included, and checks each against the stages. Tests
// may import any stage: keepdebug's test symbolizes what it kept, the
// store's test fetches through the debuginfod client.
func TestImportsFollowDataPath(t *testing.T) {
	root := testfixture.Root(t)
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || name == "_build" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module (internal/tools)
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok {
				continue
			}
			if !allowed(stageOf(pkg), stageOf(dep)) {
				t.Errorf("%s: %s (%s) imports %s (%s); move what both need below both (docs/architecture.md)",
					fset.Position(imp.Pos()), pkg, stageOf(pkg), dep, stageOf(dep))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read only %d Go files under %s", files, root)
	}
}
