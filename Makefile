# profsym: see README.md. `make test` is what CI runs (through .ci/run).
GO        ?= go
BIN       := _build
FUZZTIME  ?= 10s
BENCHTIME ?= 1x
CLANG     ?= clang-19

OTELCOL   := $(BIN)/otelcol-profsym
TESTSUMMARY := $(BIN)/testsummary
BUILDER   := $(BIN)/builder
GATES     := --feature-gates=service.profilesSupport
PROFSYM_OUTPUT ?= ./out/profiles.json
PROFSYM_OUTPUT_MAX_MB ?= 100
PROFSYM_OUTPUT_BACKUPS ?= 3
export PROFSYM_OUTPUT PROFSYM_OUTPUT_MAX_MB PROFSYM_OUTPUT_BACKUPS

.PHONY: kube-tools lint all build test test-short test-kernels vet check-cross bench bench-symbolize bench-processor bench-sampler bench-offcpu bench-cgselect bench-fleet bench-unwind bench-unwind-cost bench-jfr bench-cpython bench-perl bench-php bench-ruby bench-hotspot fuzz run otelcol image image-push generate check-generate clean

all: build otelcol

build:
	$(GO) build -o $(BIN)/profsym ./cmd/profsym

vet:
	$(GO) vet ./...

# golangci-lint with contrib's linters (.golangci.yml) on what changed since
# LINT_BASE, the commit before the configuration arrived: new code is held
# to it, older code as it is touched. LINT_BASE=origin/main lints a branch.
LINT_BASE ?= c657c3629aea
GOLANGCI_LINT ?= golangci-lint
lint:
	$(GOLANGCI_LINT) run --allow-parallel-runners --new-from-rev=$(LINT_BASE) ./...

# The processor and the CLI build for macOS and Windows too (the sampler and
# the receiver build there as stubs that say Linux is needed); the sampler
# builds for Linux on arm64, and elsewhere (riscv64) as a stub that says
# which CPUs it knows.
check-cross:
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=darwin GOARCH=amd64 $(GO) build ./...
	GOOS=windows GOARCH=amd64 $(GO) build ./...
	GOOS=linux GOARCH=arm64 $(GO) build ./...
	GOOS=linux GOARCH=arm64 $(GO) vet ./internal/host/... ./bpf/...
	GOOS=linux GOARCH=riscv64 $(GO) build ./...

# The real kube-apiserver and etcd of test/e2e/k8s, built from source in
# their own module (test/tools/kube) and kept between runs in a folder named
# by the hash of that module's files (test/e2e/k8s finds it the same way, or
# through PROFSYM_KUBE_TOOLS): the first build takes minutes, later ones
# are a stat, whatever a fresh clone does to file times.
KUBE_SRC   := test/tools/kube/go.mod test/tools/kube/go.sum test/tools/kube/etcd/main.go
KUBE_TOOLS ?= $(HOME)/.cache/profsym/kube-$(shell cat $(KUBE_SRC) | sha256sum | cut -c1-12)
kube-tools: $(KUBE_TOOLS)/kube-apiserver $(KUBE_TOOLS)/etcd

$(KUBE_TOOLS)/kube-apiserver:
	@mkdir -p $(KUBE_TOOLS)
	cd test/tools/kube && $(GO) build -trimpath -ldflags='-s -w' -o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver && mv -f $@.tmp $@

$(KUBE_TOOLS)/etcd:
	@mkdir -p $(KUBE_TOOLS)
	cd test/tools/kube && $(GO) build -trimpath -ldflags='-s -w' -o $@.tmp ./etcd && mv -f $@.tmp $@

# Unit, accuracy (against llvm-symbolizer-19) and real-eBPF tests, and the
# image run in podman (deploy/helmtest). Under CI=true, tests that lack a
# tool or privilege fail instead of skipping. testsummary prints what go
# test would, then every skipped test and why.
#
# Every package runs under the race detector but those below, each for its
# reason; the race pass replaces the plain one, and what it leaves out runs
# plain after it:
# - test/kernels, deploy/..., internal/e2e: their tests drive other
#   processes (qemu, podman, the built binaries), so the detector would
#   watch only the launcher;
# - NORACE_TESTS (in NORACE_TEST_PKGS): memory figures the detector's shadow
#   memory breaks: elfx's peak RSS of a child (TestHostileFileRSS), the
#   processor's RSS growth against its budget (TestMemoryBudget: 174 MB for
#   a 38 MB budget under -race), and the CLI's collector hold under a 2 GiB
#   address space (TestHoldGCUnderAddressSpaceLimit: a race binary maps
#   2.1 GiB before it starts).
NORACE_PKGS      := ./test/kernels ./deploy/... ./internal/e2e
NORACE_TESTS     := TestHostileFileRSS|TestMemoryBudget|TestHoldGCUnderAddressSpaceLimit
NORACE_TEST_PKGS := ./internal/elfx ./processor/symbolizationprocessor ./cmd/profsym
RACE_PKGS     = $(shell $(GO) list ./... | grep -v -e '/test/kernels$$' -e '/deploy/' -e '/internal/e2e$$')

test: vet check-cross build otelcol image $(TESTSUMMARY)
	$(TESTSUMMARY) $(GO) test -json -count=1 -race -timeout 75m -skip '^($(NORACE_TESTS))$$' $(RACE_PKGS)
	$(TESTSUMMARY) $(GO) test -json -count=1 -timeout 30m $(NORACE_PKGS)
	$(TESTSUMMARY) $(GO) test -json -count=1 -timeout 30m -run '^($(NORACE_TESTS))$$' $(NORACE_TEST_PKGS)

# The developer's loop: vet and every test that needs no privilege, eBPF,
# VM or chroot (those skip under -short, CI or not: testfixture.Short), and
# no build of the distribution, the image or the kernel matrix. Run it
# while you work; make test before you push.
test-short: vet
	$(GO) test -short -count=1 -timeout 10m ./...

bench: bench-symbolize bench-processor bench-sampler bench-offcpu bench-cgselect bench-jfr
	$(GO) test -run '^$$' -bench . -benchmem -benchtime=$(BENCHTIME) ./internal/...

# The sampler's and the unwinder's tests on Debian's kernels in qemu: 5.10,
# 6.1, 6.12 and arm64 6.1 (test/kernels; docs/kernels.md), and on arm64 the
# runtimes' tests and the end-to-end runtime tests of the arm64 binaries
# make image builds. Kernels and images are cached in $$PROFSYM_KERNEL_CACHE
# (default ~/.cache/profsym/kernels); KERNELS=5.10,6.1 runs a subset. About
# 18 minutes under TCG on 2 cores.
# (Prerequisites expand as the rule is read: IMAGE_DIR is set further down.)
test-kernels: $(BIN)/image/arm64/otelcol-profsym $(BIN)/image/arm64/profsym
	@mkdir -p $(BIN)
	$(GO) run ./test/kernels $(if $(KERNELS),-only $(KERNELS)) -built $(BIN)/image -out $(BIN)/test-kernels.md

# Side by side with llvm-symbolizer-19: cold process wall time, warm
# per-address cost and peak RSS over >=10,000 addresses of Go's compile
# binary (with DWARF) and of libc with its libc6-dbg debug file.
bench-symbolize:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench 'BenchmarkSymbolize' -benchtime=$(BENCHTIME) -timeout 30m ./internal/symbolize/ | tee $(BIN)/bench-symbolize.txt

# 10,000 samples / 200,000 locations over 50 binaries through the processor:
# warm ns/location, cold cost against the engine's own, heap.
bench-processor:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench BenchmarkProcessor -benchtime=10x -timeout 30m ./processor/symbolizationprocessor/ | tee $(BIN)/bench-processor.txt

# The full receiver at 99 Hz with both cores busy, side by side with
# `perf record -F 99 -a -g` (PROFSYM_BENCH_SECONDS, default 60), steady and
# with 20 new processes a second; ends with a summary table (steady-state
# CPU, BPF ns per sample, RSS at the end, peak RSS, start-up peak).
bench-sampler:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-60} $(GO) test -run '^$$' -bench BenchmarkSamplerOverhead -benchtime 1x -timeout 15m ./receiver/profilingreceiver | tee $(BIN)/bench-sampler.txt

# What following Java stacks costs the agent: sampler and reports at 99 Hz
# with a JVM busy on both cores, the HotSpot walker off (native-only) and on,
# side by side (PROFSYM_BENCH_SECONDS per run, default 60): agent CPU, BPF
# ns per sample, RSS, Java frames per sample.
bench-hotspot:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-60} $(GO) test -run '^$$' -bench HotSpotCost -benchtime 1x -timeout 15m ./internal/host/runtimes/hotspot | tee $(BIN)/bench-hotspot.txt

# Off-CPU profiles under a context-switch storm: `perf bench sched pipe`
# pinned on every CPU, in interleaved rounds alone, beside the CPU-only
# receiver and beside it with off_cpu on (PROFSYM_BENCH_ROUNDS, default 6,
# of PROFSYM_BENCH_LOOPS round trips): the storm's throughput and CPU per
# round trip, the receiver's CPU, the sched_switch program's ns per run.
bench-offcpu:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench BenchmarkOffCPUStorm -benchtime 1x -timeout 30m ./receiver/profilingreceiver | tee $(BIN)/bench-offcpu.txt

# Targets selected in the kernel by cgroup: the agent's CPU plus its BPF
# programs' run time with a busy process in a cgroup no target selects,
# over the same without it, in alternating windows of one run
# (PROFSYM_BENCH_ROUNDS pairs, default 3, of PROFSYM_BENCH_SECONDS, default
# 10): cost_ratio, target <= 1.15.
bench-cgselect:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench BenchmarkCgroupSelection -benchtime 1x -timeout 15m ./receiver/profilingreceiver | tee $(BIN)/bench-cgselect.txt

# Issue 32's mix, as a fleet node looks: two busy FP-less C processes, a
# JVM, a Python process, 20 new processes a second, 99 Hz; receivers with
# CPU profiles only, off_cpu as before issue 32 (preempted_probability 1)
# and off_cpu with its defaults in interleaved rounds over the same
# workload (PROFSYM_BENCH_ROUNDS, default 3, of PROFSYM_BENCH_SECONDS,
# default 30): agent CPU, each program's runs, ns a run and share of a core
# (bpf_stats), waits chosen. PROFSYM_BENCH_OFFCPU_TARGET=all records the
# whole host's waits, not only the mix's.
bench-fleet:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench BenchmarkFleetMix -benchtime 1x -timeout 30m ./receiver/profilingreceiver | tee $(BIN)/bench-fleet.txt

# Unwinding side by side with `perf record --call-graph dwarf` on the same
# fixtures: whole-chain fraction, CPU, BPF time per sample
# (PROFSYM_BENCH_FIXTURE_SECONDS, default 5). Also run by `bench` through
# ./internal/...; bench-sampler gives the agent's overhead and churn figures.
bench-unwind:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench WholeChainVsPerf -benchtime 1x -timeout 15m ./internal/host/unwind | tee $(BIN)/bench-unwind.txt

# What walking Python costs the agent, beside the native-only walk of the
# same busy Python processes on both cores (Debian's 3.9, 3.11, 3.13):
# agent CPU, BPF time per sample, RSS (PROFSYM_BENCH_SECONDS, default 30).
bench-cpython:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-30} $(GO) test -run '^$$' -bench BenchmarkPythonCost -benchtime 1x -timeout 30m ./internal/host/runtimes/cpython | tee $(BIN)/bench-cpython.txt

bench-perl:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-30} $(GO) test -run '^$$' -bench BenchmarkPerlCost -benchtime 1x -timeout 30m ./internal/host/runtimes/perl | tee $(BIN)/bench-perl.txt

# What walking PHP costs the agent, beside the native-only walk of the same
# busy PHP processes on both cores (Debian's 8.2 and 8.4), as bench-cpython.
bench-php:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-30} $(GO) test -run '^$$' -bench BenchmarkPHPCost -benchtime 1x -timeout 30m ./internal/host/runtimes/php | tee $(BIN)/bench-php.txt

# The same for Ruby (Debian's 3.1 and 3.3).
bench-ruby:
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-30} $(GO) test -run '^$$' -bench BenchmarkRubyCost -benchtime 1x -timeout 30m ./internal/host/runtimes/ruby | tee $(BIN)/bench-ruby.txt

# What a table build and a new process cost the agent, in figures the
# machine's load does not move: CPU-seconds, bytes allocated, heap and RSS
# high-water marks (BenchmarkBuildFile, BenchmarkNewProcess), and callgrind
# instruction counts of fixed workloads (net of "none"; valgrind).
bench-unwind-cost:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench 'BuildFile|NewProcess' -benchtime 20x ./internal/host/unwind | tee $(BIN)/bench-unwind-cost.txt
	$(GO) test -c -o $(BIN)/unwind.test ./internal/host/unwind
	@for w in none libc go-compile libLLVM snapshot; do \
	  printf 'callgrind %-11s ' $$w; \
	  PROFSYM_COST_WORKLOAD=$$w GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
	    $(BIN)/unwind.test -test.run TestCostWorkload 2>&1 | sed -n 's/.*Collected : //p'; \
	done | tee -a $(BIN)/bench-unwind-cost.txt

# The real agent (root) next to two busy processes, symbol uploads off and on,
# one of them carrying 100 MB of debug info: the workloads' throughput, the
# agent's CPU and its busiest second (PROFSYM_BENCH_SECONDS per variant,
# default 90). Not part of `bench`: it needs root and a quiet machine.
bench-upload: otelcol
	@mkdir -p $(BIN)
	PROFSYM_BENCH_SECONDS=$${PROFSYM_BENCH_SECONDS:-90} $(GO) test -run '^$$' -bench BenchmarkAgentUploadOverhead -benchtime 1x -timeout 20m ./processor/symboluploadprocessor/ | tee $(BIN)/bench-upload.txt

# A 100 MB multi-chunk JDK 17 recording through profsym convert and the
# JDK's jfr print --json, side by side: wall time, peak RSS, speedup.
bench-jfr:
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench BenchmarkConvertJFR100MB -benchtime 1x -timeout 30m ./cmd/profsym/ | tee $(BIN)/bench-jfr.txt

# profsym beside the upstream OpenTelemetry eBPF profiler on the same Java
# (every JDK, -Xint and C2) and Python fixture processes: each fixture's
# whole-named-chain share in each one's output (upstream's through an OTLP
# sink collector). UPSTREAM=/path/to/ebpf-profiler names upstream's binary;
# JAVAE2E=jdk17,... picks JDKs. Needs root; not in `bench` nor CI: the
# figures go to notes.
.PHONY: bench-runtimes
bench-runtimes: otelcol
	@mkdir -p $(BIN)
	@test -n "$(UPSTREAM)" || { echo 'set UPSTREAM=/path/to/ebpf-profiler'; exit 2; }
	PROFSYM_UPSTREAM=$(abspath $(UPSTREAM)) $(GO) test -count=1 -run '^TestBenchRuntimesVsUpstream$$' -v -timeout 30m ./internal/e2e/ | tee $(BIN)/bench-runtimes.log

# A short run of every go test -fuzz target. Minimizing a new crasher or
# input can run far past -fuzztime, so it is off: a crasher is saved as is.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0 $$pkg; \
	  done; \
	done

# The distribution, built with the collector builder from builder-config.yaml.
# Make rebuilds it only when a Go file or the builder config changed; the Go
# build cache makes that rebuild incremental.
otelcol: $(OTELCOL)

$(BUILDER): internal/tools/go.mod internal/tools/go.sum
	cd internal/tools && $(GO) build -o $(abspath $(BUILDER)) go.opentelemetry.io/collector/cmd/builder

GO_SOURCES := go.mod go.sum $(shell git ls-files '*.go' 2>/dev/null | grep -v '_test.go$$')

$(OTELCOL): $(BUILDER) builder-config.yaml $(GO_SOURCES)
	$(BUILDER) --config builder-config.yaml
	cp $(BIN)/otelcol-profsym-src/otelcol-profsym $(OTELCOL).tmp && mv -f $(OTELCOL).tmp $(OTELCOL)

# The container image: static (CGO_ENABLED=0) binaries of the distribution
# and the CLI for every IMAGE_ARCHES, on an empty base with CA certificates
# (deploy/image), written as one multi-architecture OCI archive with no
# network and no container engine, then loaded into podman (or docker) when
# one is installed. The same commit gives the same digests. Push it with
# `podman manifest push` or `skopeo copy --all` (docs/deployment.md).
VERSION      := $(shell sed -n 's/^  version: *//p' builder-config.yaml)
IMAGE        ?= profsym/otelcol-profsym
IMAGE_TAG    ?= $(VERSION)
IMAGE_ARCHES ?= amd64 arm64
IMAGE_DIR    := $(BIN)/image
IMAGE_OCI    := $(IMAGE_DIR)/otelcol-profsym-$(IMAGE_TAG).oci.tar
HOST_ARCH    := $(shell $(GO) env GOARCH)
# The builder's own flags (-trimpath, -s -w, CGO_ENABLED=0), so the host
# architecture's binary is the one `make otelcol` built.
STATIC       := CGO_ENABLED=0 GOOS=linux
STATIC_FLAGS := -trimpath -ldflags='-s -w'

image: $(IMAGE_OCI)
	@if command -v podman >/dev/null; then podman load -q -i $(IMAGE_OCI); \
	elif command -v docker >/dev/null; then docker load -i $(IMAGE_OCI); \
	else echo "no podman or docker: $(IMAGE_OCI) not loaded"; fi
	@echo "image $(IMAGE):$(IMAGE_TAG) ($(IMAGE_ARCHES)): $(IMAGE_OCI)"

# Push every architecture of the archive as one multi-architecture image:
#   make image-push PUSH=docker://registry.example.com/profsym/otelcol-profsym:0.1.0
# (podman login to the registry first; any containers-transport works, e.g.
# oci:DIR:TAG). skopeo copy --all oci-archive:ARCHIVE docker://... does the same.
PUSH_LIST := localhost/profsym-image-push:$(IMAGE_TAG)
image-push: $(IMAGE_OCI)
	@test -n "$(PUSH)" || (echo "set PUSH, e.g. PUSH=docker://registry.example.com/profsym/otelcol-profsym:$(IMAGE_TAG)"; exit 1)
	-@podman manifest rm $(PUSH_LIST) >/dev/null 2>&1
	podman manifest create $(PUSH_LIST) >/dev/null
	podman manifest add --all $(PUSH_LIST) oci-archive:$(abspath $(IMAGE_OCI)) >/dev/null
	podman manifest push --all $(PUSH_LIST) $(PUSH); status=$$?; podman manifest rm $(PUSH_LIST) >/dev/null; exit $$status

$(IMAGE_OCI): deploy/image/*.go $(foreach a,$(IMAGE_ARCHES),$(IMAGE_DIR)/$(a)/otelcol-profsym $(IMAGE_DIR)/$(a)/profsym)
	$(GO) run ./deploy/image -o $@ -ref $(IMAGE):$(IMAGE_TAG) -version $(VERSION) \
	  -revision "$$(git rev-parse HEAD 2>/dev/null)" -created "$$(git log -1 --format=%ct 2>/dev/null || echo 0)" \
	  $(foreach a,$(IMAGE_ARCHES),-arch $(a)=$(IMAGE_DIR)/$(a))

$(IMAGE_DIR)/$(HOST_ARCH)/otelcol-profsym: $(OTELCOL)
	@mkdir -p $(dir $@)
	cp $(OTELCOL) $@.tmp && mv -f $@.tmp $@

# Other architectures: the builder's generated sources, cross-compiled.
$(IMAGE_DIR)/%/otelcol-profsym: $(OTELCOL)
	@mkdir -p $(dir $@)
	cd $(BIN)/otelcol-profsym-src && $(STATIC) GOARCH=$* $(GO) build $(STATIC_FLAGS) -o $(abspath $@) .

$(IMAGE_DIR)/%/profsym: $(GO_SOURCES)
	@mkdir -p $(dir $@)
	$(STATIC) GOARCH=$* $(GO) build $(STATIC_FLAGS) -o $@ ./cmd/profsym

# Profile this host: sample every CPU, symbolize, print a summary every
# report interval and write OTLP JSON profiles to $(PROFSYM_OUTPUT), rotated
# at PROFSYM_OUTPUT_MAX_MB with PROFSYM_OUTPUT_BACKUPS old files kept.
run: build otelcol
	@mkdir -p $(dir $(PROFSYM_OUTPUT))
	@echo "profsym: profiling this host (Ctrl-C to stop)."
	@echo "  profiles (OTLP JSON) go to $(abspath $(PROFSYM_OUTPUT)), rotated at $(PROFSYM_OUTPUT_MAX_MB) MB:"
	@echo "  $(PROFSYM_OUTPUT_BACKUPS) older files kept beside it ($(basename $(notdir $(PROFSYM_OUTPUT)))-<time>$(suffix $(PROFSYM_OUTPUT)))"
	@echo "  hottest functions:   $(BIN)/profsym top $(PROFSYM_OUTPUT)"
	@echo "  flame graph:         $(BIN)/profsym convert $(PROFSYM_OUTPUT) --to pprof -o out/profile.pb.gz && go tool pprof -http=: out/profile.pb.gz"
	$(OTELCOL) --config config/default.yaml $(GATES)

MDATAGEN := $(BIN)/mdatagen

# mdatagen is pinned in its own module (internal/tools) so its dependencies
# never mix with the distribution's.
$(MDATAGEN): internal/tools/go.mod internal/tools/go.sum
	cd internal/tools && $(GO) build -o $(abspath $(MDATAGEN)) go.opentelemetry.io/collector/cmd/mdatagen

$(TESTSUMMARY): $(wildcard internal/tools/testsummary/*.go) internal/tools/go.mod
	cd internal/tools && $(GO) build -o $(abspath $(TESTSUMMARY)) ./testsummary

# Regenerate eBPF objects and bindings (needs clang-19, llvm-strip-19 and
# libbpf-dev) and the components' metadata code (mdatagen).
generate: $(MDATAGEN)
	$(GO) generate ./bpf/...
	@if ls receiver/*/metadata.yaml processor/*/metadata.yaml extension/*/metadata.yaml >/dev/null 2>&1; then \
	  PATH=$(abspath $(BIN)):$$PATH $(GO) generate ./receiver/... ./processor/... ./extension/...; fi

# CI: the committed generated files must be what `make generate` produces.
check-generate: generate
	@git diff --exit-code --stat -- bpf/ receiver/ processor/ extension/ || (echo "generated files are stale: run make generate and commit"; exit 1)
	@test -z "$$(git status --porcelain -- bpf/ receiver/ processor/ extension/)" || (git status --porcelain -- bpf/ receiver/ processor/ extension/; echo "make generate created files that are not committed"; exit 1)

clean:
	rm -rf $(BIN)
