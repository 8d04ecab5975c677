package helmtest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/confmap"
	"go.uber.org/zap"

	"github.com/profsym/profsym/processor/symbolizationprocessor"
)

// gatewayMemory reads what a rendered gateway says about memory: its
// container limit, GOMEMLIMIT, the memory limiter's soft limit in bytes,
// and the symbolization processor's cache budget as the processor itself
// computes it from the rendered configuration.
type gatewayMem struct {
	limit, goMemLimit, soft, budget int64
	cfg                             *symbolizationprocessor.Config
}

func gatewayMemory(t *testing.T, d docs) gatewayMem {
	t.Helper()
	c := container(d.must(t, "Deployment", gatewayName))
	var m gatewayMem
	if q := get(c, "resources", "limits", "memory"); q != nil {
		m.limit = quantity(t, fmt.Sprint(q))
	}
	if e, ok := env(c)["GOMEMLIMIT"]; ok {
		v := str(e, "value")
		n, err := strconv.ParseInt(strings.TrimSuffix(v, "B"), 10, 64)
		if err != nil || !strings.HasSuffix(v, "B") {
			t.Fatalf("GOMEMLIMIT %q is not a number of bytes", v)
		}
		m.goMemLimit = n
	}
	cfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	ml := mapping(cfg, "processors", "memory_limiter")
	lp, _ := ml["limit_percentage"].(int)
	sp, _ := ml["spike_limit_percentage"].(int)
	m.soft = m.limit * int64(lp-sp) / 100
	pc := symbolizationprocessor.NewFactory().CreateDefaultConfig().(*symbolizationprocessor.Config)
	if err := confmap.NewFromStringMap(mapping(cfg, "processors", "symbolization")).Unmarshal(pc); err != nil {
		t.Fatalf("the rendered symbolization config does not load: %v", err)
	}
	if err := pc.Validate(); err != nil {
		t.Fatalf("the rendered symbolization config is invalid: %v", err)
	}
	m.cfg = pc
	m.budget = pc.Options(zap.NewNop()).MemoryBudget()
	return m
}

// quantity parses the Kubernetes memory quantities the tests use.
func quantity(t *testing.T, q string) int64 {
	t.Helper()
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"", 1}} {
		if n, ok := strings.CutSuffix(q, u.suffix); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil {
				continue
			}
			return int64(f * u.mult)
		}
	}
	t.Fatalf("quantity %q", q)
	return 0
}

// The gateway's memory adds up: GOMEMLIMIT is 80% of its container limit,
// and the processor's caches, as the processor counts them, fit below the
// memory limiter's soft limit (else, once they fill, every batch would be
// refused); decompressed sections are bounded by the object cache.
func checkGatewayMemory(t *testing.T, m gatewayMem, limit int64) {
	t.Helper()
	if m.limit != limit {
		t.Fatalf("memory limit %d, want %d", m.limit, limit)
	}
	if want := limit * 80 / 100; m.goMemLimit != want {
		t.Errorf("GOMEMLIMIT %d, want 80%% of %d = %d", m.goMemLimit, limit, want)
	}
	if m.budget > m.soft {
		t.Errorf("caches may hold %d MiB, above the memory limiter's soft limit %d MiB", m.budget>>20, m.soft>>20)
	}
	// Derived from 45% of the limit: most of it used, none beyond.
	if share := limit * 45 / 100; m.budget > share || m.budget < share*3/4 {
		t.Errorf("caches may hold %d MiB of a %d MiB share", m.budget>>20, share>>20)
	}
	if m.cfg.Limits.MaxDecompressedBytes > m.cfg.Cache.MaxBytes || m.cfg.Limits.MaxDecompressedBytes == 0 {
		t.Errorf("max_decompressed_bytes %d, cache max_bytes %d", m.cfg.Limits.MaxDecompressedBytes, m.cfg.Cache.MaxBytes)
	}
	t.Logf("limit %d MiB: GOMEMLIMIT %d MiB, caches %d MiB (objects %d MiB, results %d MiB, %d identities), limiter soft limit %d MiB",
		limit>>20, m.goMemLimit>>20, m.budget>>20, m.cfg.Cache.MaxBytes>>20, m.cfg.Cache.MaxResultBytes>>20, m.cfg.Cache.MaxObjects, m.soft>>20)
}

func TestGatewayMemory(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		d := mustTemplate(t)
		m := gatewayMemory(t, d)
		checkGatewayMemory(t, m, 1536<<20)
		cfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
		p := strs(cfg, "service", "pipelines", "profiles", "processors")
		if len(p) == 0 || p[0] != "memory_limiter" {
			t.Errorf("gateway profiles processors %v: memory_limiter must come first", p)
		}
	})
	t.Run("scales-with-limit", func(t *testing.T) {
		checkGatewayMemory(t, gatewayMemory(t, mustTemplate(t, "--set", "gateway.resources.limits.memory=4Gi")), 4<<30)
		checkGatewayMemory(t, gatewayMemory(t, mustTemplate(t, "--set", "gateway.resources.limits.memory=3G")), 3e9)
	})
	t.Run("explicit-values", func(t *testing.T) {
		m := gatewayMemory(t, mustTemplate(t, "--set", "gateway.symbolization.cache.maxBytes=100000000",
			"--set", "gateway.symbolization.limits.maxDecompressedBytes=50000000", "--set", "gateway.symbolization.cache.maxObjects=1000"))
		if m.cfg.Cache.MaxBytes != 100000000 || m.cfg.Limits.MaxDecompressedBytes != 50000000 || m.cfg.Cache.MaxObjects != 1000 {
			t.Errorf("explicit values not kept: %+v %+v", m.cfg.Cache, m.cfg.Limits)
		}
	})
	t.Run("no-limit", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.resources.limits.memory=null")
		m := gatewayMemory(t, d)
		if m.goMemLimit != 0 {
			t.Errorf("GOMEMLIMIT %d without a memory limit", m.goMemLimit)
		}
		def := symbolizationprocessor.NewFactory().CreateDefaultConfig().(*symbolizationprocessor.Config)
		if m.cfg.Cache.MaxBytes != def.Cache.MaxBytes || m.cfg.Limits.MaxDecompressedBytes != def.Limits.MaxDecompressedBytes {
			t.Errorf("without a limit the processor's defaults apply: %+v", m.cfg.Cache)
		}
	})
	t.Run("own-gomemlimit", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.extraEnv[0].name=GOMEMLIMIT", "--set", "gateway.extraEnv[0].value=1GiB")
		n := 0
		for _, e := range list(container(d.must(t, "Deployment", gatewayName)), "env") {
			if str(e, "name") == "GOMEMLIMIT" {
				n++
				wantEqual(t, "GOMEMLIMIT", str(e, "value"), "1GiB")
			}
		}
		wantEqual(t, "GOMEMLIMIT entries", n, 1)
		if m := gatewayMemory(t, mustTemplate(t, "--set", "gateway.goMemLimitPercentage=null")); m.goMemLimit != 0 {
			t.Errorf("goMemLimitPercentage null: GOMEMLIMIT %d", m.goMemLimit)
		}
	})
}

// agentGoMemLimit reads a rendered agent's container memory limit and
// GOMEMLIMIT (0: none), failing on more than one GOMEMLIMIT entry.
func agentGoMemLimit(t *testing.T, d docs) (limit, goMemLimit int64) {
	t.Helper()
	return goMemLimitOf(t, d, "DaemonSet", agentName)
}

// goMemLimitOf reads a workload's memory limit and GOMEMLIMIT in bytes (0:
// not set, -1: set by the user in another unit).
func goMemLimitOf(t *testing.T, d docs, kind, name string) (limit, goMemLimit int64) {
	t.Helper()
	c := container(d.must(t, kind, name))
	if q := get(c, "resources", "limits", "memory"); q != nil {
		limit = quantity(t, fmt.Sprint(q))
	}
	n := 0
	for _, e := range list(c, "env") {
		if str(e, "name") != "GOMEMLIMIT" {
			continue
		}
		n++
		v := str(e, "value")
		b, err := strconv.ParseInt(strings.TrimSuffix(v, "B"), 10, 64)
		if err != nil || !strings.HasSuffix(v, "B") {
			return limit, -1 // set by the user in another unit
		}
		goMemLimit = b
	}
	if n > 1 {
		t.Errorf("%d GOMEMLIMIT entries in the %s", n, name)
	}
	return limit, goMemLimit
}

// The agent's GOMEMLIMIT is goMemLimitPercentage (80%) of its container
// limit less the BPF maps, which the kernel charges to the same cgroup
// but the Go runtime does not see: with a target of 80% of the whole
// limit, the runtime would let garbage grow until maps plus heap passed
// the limit, and the container be killed before the collector tried.
func TestAgentMemory(t *testing.T) {
	const bpf = 128 << 20
	check := func(t *testing.T, d docs, limit int64) {
		t.Helper()
		gotLimit, gml := agentGoMemLimit(t, d)
		wantEqual(t, "agent memory limit", gotLimit, limit)
		if want := (limit - bpf) * 80 / 100; gml != want {
			t.Errorf("agent GOMEMLIMIT %d, want 80%% of %d - %d = %d", gml, limit, int64(bpf), want)
		}
		if gml+bpf >= limit {
			t.Errorf("GOMEMLIMIT %d MiB plus the BPF maps %d MiB do not fit in %d MiB", gml>>20, bpf>>20, limit>>20)
		}
		// The memory limiter's limits are shares of the same memory: the
		// limit less the BPF maps, which it does not see either.
		ml := mapping(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "memory_limiter")
		lim, _ := ml["limit_mib"].(int)
		spike, _ := ml["spike_limit_mib"].(int)
		if want := (limit - bpf) * 80 / 100 >> 20; int64(lim) != want || int64(spike) != (limit-bpf)*25/100>>20 {
			t.Errorf("agent memory_limiter %v, want limit_mib %d (80%% of %d MiB) and spike 25%%", ml, want, (limit-bpf)>>20)
		}
		t.Logf("agent limit %d MiB: BPF maps %d MiB, GOMEMLIMIT %d MiB, memory_limiter %d MiB (spike %d)", limit>>20, bpf>>20, gml>>20, lim, spike)
	}
	t.Run("defaults", func(t *testing.T) { check(t, mustTemplate(t), 512<<20) })
	t.Run("scales-with-limit", func(t *testing.T) {
		check(t, mustTemplate(t, "--set", "agent.resources.limits.memory=1Gi"), 1<<30)
		check(t, mustTemplate(t, "--set", "agent.resources.limits.memory=2G"), 2e9)
	})
	t.Run("no-bpf-reserve", func(t *testing.T) {
		// bpfMemory 0: exactly the gateway's treatment, 80% of the limit.
		_, gml := agentGoMemLimit(t, mustTemplate(t, "--set", "agent.bpfMemory=0"))
		wantEqual(t, "GOMEMLIMIT", gml, int64(512<<20)*80/100)
	})
	t.Run("no-limit", func(t *testing.T) {
		if _, gml := agentGoMemLimit(t, mustTemplate(t, "--set", "agent.resources.limits.memory=null")); gml != 0 {
			t.Errorf("GOMEMLIMIT %d without a memory limit", gml)
		}
	})
	t.Run("own-gomemlimit", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.extraEnv[0].name=GOMEMLIMIT", "--set", "agent.extraEnv[0].value=200MiB")
		if _, gml := agentGoMemLimit(t, d); gml != -1 {
			t.Errorf("the user's GOMEMLIMIT was not the only one: %d", gml)
		}
		if _, gml := agentGoMemLimit(t, mustTemplate(t, "--set", "agent.goMemLimitPercentage=null")); gml != 0 {
			t.Errorf("goMemLimitPercentage null: GOMEMLIMIT %d", gml)
		}
	})
	t.Run("limit-below-maps", func(t *testing.T) {
		if _, err := template(t, "--set", "agent.resources.limits.memory=100Mi"); err == nil || !strings.Contains(err.Error(), "bpfMemory") {
			t.Errorf("a limit below the BPF maps: %v", err)
		}
	})
	t.Run("gateway-unchanged", func(t *testing.T) {
		m := gatewayMemory(t, mustTemplate(t))
		checkGatewayMemory(t, m, 1536<<20)
		// The gateway's batches wait for slow downloads and opens at most
		// fetch_wait (the chart's value, the processor's default).
		wantEqual(t, "gateway fetch_wait", m.cfg.FetchWait, symbolizationprocessor.DefaultFetchWait)
	})
}

// The symbol store's pod parses and decompresses every upload to verify
// it: GOMEMLIMIT keeps its heap collected before its container is killed.
func TestSymbolsMemory(t *testing.T) {
	limit, gml := goMemLimitOf(t, mustTemplate(t), "StatefulSet", symbolsName)
	wantEqual(t, "symbols memory limit", limit, int64(512<<20))
	wantEqual(t, "symbols GOMEMLIMIT", gml, int64(512<<20)*80/100)
	_, gml = goMemLimitOf(t, mustTemplate(t, "--set", "symbols.store.resources.limits.memory=2Gi"), "StatefulSet", symbolsName)
	wantEqual(t, "symbols GOMEMLIMIT at 2Gi", gml, int64(2<<30)*80/100)
	if _, gml := goMemLimitOf(t, mustTemplate(t, "--set", "symbols.store.goMemLimitPercentage=null"), "StatefulSet", symbolsName); gml != 0 {
		t.Errorf("goMemLimitPercentage null: GOMEMLIMIT %d", gml)
	}
	d := mustTemplate(t, "--set", "symbols.store.extraEnv[0].name=GOMEMLIMIT", "--set", "symbols.store.extraEnv[0].value=300MiB")
	if _, gml := goMemLimitOf(t, d, "StatefulSet", symbolsName); gml != -1 {
		t.Errorf("the user's GOMEMLIMIT was not the only one: %d", gml)
	}
}
