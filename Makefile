# profsym: see README.md. `make test` is what CI runs (through .ci/run).
GO        ?= go
BIN       := _build
FUZZTIME  ?= 10s
BENCHTIME ?= 1x
CLANG     ?= clang-19

.PHONY: all build test vet bench bench-symbolize fuzz run generate check-generate clean

all: build

build:
	$(GO) build -o $(BIN)/profsym ./cmd/profsym

vet:
	$(GO) vet ./...

# Unit, accuracy (against llvm-symbolizer-19) and real-eBPF tests. Under
# CI=true, tests that lack a tool or privilege fail instead of skipping.
test: vet
	$(GO) test -count=1 -timeout 75m ./...

bench: bench-symbolize
	$(GO) test -run '^$$' -bench . -benchmem -benchtime=$(BENCHTIME) ./internal/...

# Side by side with llvm-symbolizer-19: cold process wall time, warm
# per-address cost and peak RSS over >=10,000 addresses of Go's compile
# binary (with DWARF) and of libc with its libc6-dbg debug file.
bench-symbolize:
	$(GO) test -run '^$$' -bench 'BenchmarkSymbolize' -benchtime=$(BENCHTIME) -timeout 30m ./internal/symbolize/ | tee $(BIN)/bench-symbolize.txt

# A short run of every go test -fuzz target.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

run:
	@echo "make run: the collector distribution is not built yet (see the distribution issue); meanwhile: $(BIN)/profsym symbolize --help"
	@$(MAKE) --no-print-directory build

MDATAGEN := $(BIN)/mdatagen

# mdatagen is pinned in its own module (internal/tools) so its dependencies
# never mix with the distribution's.
$(MDATAGEN): internal/tools/go.mod internal/tools/go.sum
	cd internal/tools && $(GO) build -o $(abspath $(MDATAGEN)) go.opentelemetry.io/collector/cmd/mdatagen

# Regenerate eBPF objects and bindings (needs clang-19, llvm-strip-19 and
# libbpf-dev) and the components' metadata code (mdatagen).
generate: $(MDATAGEN)
	$(GO) generate ./bpf/...
	@if ls receiver/*/metadata.yaml processor/*/metadata.yaml >/dev/null 2>&1; then \
	  PATH=$(abspath $(BIN)):$$PATH $(GO) generate ./receiver/... ./processor/...; fi

# CI: the committed generated files must be what `make generate` produces.
check-generate: generate
	@git diff --exit-code --stat -- bpf/ receiver/ processor/ || (echo "generated files are stale: run make generate and commit"; exit 1)
	@test -z "$$(git status --porcelain -- bpf/ receiver/ processor/)" || (git status --porcelain -- bpf/ receiver/ processor/; echo "make generate created files that are not committed"; exit 1)

clean:
	rm -rf $(BIN)
