package testfixture

import (
	"path/filepath"
	"testing"
)

// Thread context fixture variants (testdata/src/threadctx): how the
// program reaches otel_thread_ctx_v1 and how it publishes.
const (
	ThreadCtxExe       = "exe"         // defined in the program: local-exec
	ThreadCtxTLSDESC   = "tlsdesc"     // in libotelctx.so, TLSDESC (-mtls-dialect=gnu2)
	ThreadCtxInitialEx = "initialexec" // in libotelctxie.so, initial-exec
)

var threadCtxFlags = []string{"-O1", "-g", "-fno-omit-frame-pointer"}

// ThreadCtxProgram is the thread context fixture with the variable in the
// program (ThreadCtxExe): the one variant that needs no library, so that
// test/kernels can build it for a VM.
var ThreadCtxProgram = Spec{
	Name: "threadctx", Lang: "c", Sources: []string{"threadctx/main.c", "threadctx/otelctx.c"},
	Args: append([]string{"-Wl,--export-dynamic-symbol=otel_thread_ctx_v1"}, threadCtxFlags...),
}

// ThreadCtx builds the thread context fixture, a minimal OTEP 4947 writer,
// in its three variants, and returns their programs by variant.
func ThreadCtx(t testing.TB) map[string]string {
	t.Helper()
	flags := threadCtxFlags
	lib := func(name, model string) string {
		return Build(t, Spec{
			Name: name, Lang: "c", Sources: []string{"threadctx/otelctx.c"},
			Args: append([]string{"-fPIC", "-shared", model}, flags...),
		})
	}
	prog := func(name, so string) string {
		return Build(t, Spec{
			Name: name, Lang: "c", Sources: []string{"threadctx/main.c"},
			Args: append([]string{"-Wl,--no-as-needed", so, "-Wl,-rpath," + filepath.Dir(so)}, flags...),
		})
	}
	return map[string]string{
		ThreadCtxExe:       Build(t, ThreadCtxProgram),
		ThreadCtxTLSDESC:   prog("threadctx-tlsdesc", lib("libotelctx.so", "-mtls-dialect=gnu2")),
		ThreadCtxInitialEx: prog("threadctx-ie", lib("libotelctxie.so", "-ftls-model=initial-exec")),
	}
}
