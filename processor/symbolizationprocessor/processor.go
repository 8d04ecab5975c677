package symbolizationprocessor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/locate"
	"github.com/profsym/profsym/internal/locate/debuginfod"
	"github.com/profsym/profsym/internal/otlp/otlpsym"
	"github.com/profsym/profsym/internal/sharedcomponent"
	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

type symbolizer struct {
	cfg    *Config
	log    *zap.Logger
	set    component.TelemetrySettings
	tel    *metadata.TelemetryBuilder
	shared *sharedSym
	sym    *otlpsym.Symbolizer
	client *debuginfod.Client
	// unwatch stops the logging of contained parser panics' stacks.
	unwatch func()
}

// sharedSym is the symbolizer (caches, debuginfod client) of one
// configuration, shared by the profiles and logs pipelines that use it so
// memory bounds hold once, not per pipeline.
type sharedSym struct {
	sym    *otlpsym.Symbolizer
	client *debuginfod.Client

	mu        sync.Mutex
	last      debuginfod.Stats  // for telemetry deltas
	evictions map[string]uint64 // per cache, for telemetry deltas
	// indexTelemetry: the symbol index counters are observed through one
	// processor's telemetry, not once per processor sharing the symbolizer.
	indexTelemetry bool
}

var symbolizers = sharedcomponent.NewMap[*Config, *sharedSym]()

func newSymbolizer(set processor.Settings, cfg *Config) (*symbolizer, error) {
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	return &symbolizer{cfg: cfg, log: set.Logger, set: set.TelemetrySettings, tel: tel}, nil
}

// Options turns the configuration into the symbolizer's options; the
// debuginfod client and a symbol store's source are added by the caller.
func (c *Config) Options(log *zap.Logger) otlpsym.Options {
	return otlpsym.Options{
		Locate: locate.Config{
			Order:           c.Sources,
			LocalRoot:       c.Local.Root,
			DebugDirs:       c.DebugDirectories,
			SymbolDirs:      c.SymbolDirectories,
			Rescan:          c.SymbolDirectoriesRescan,
			MaxIndexedFiles: c.Limits.MaxIndexedFiles,
			MaxFileBytes:    c.Limits.MaxFileBytes,
		},
		Demangle:        c.Demangle != "none",
		Inlines:         c.InlineFrames,
		Lines:           c.LineNumbers,
		CacheBytes:      c.Cache.MaxBytes,
		MaxEntries:      c.Cache.MaxEntries,
		MaxResultBytes:  c.Cache.MaxResultBytes,
		MaxObjects:      c.Cache.MaxObjects,
		DemangleEntries: c.Cache.MaxDemangled,
		DemangleBytes:   c.Cache.MaxDemangledBytes,
		Timeout:         c.Timeout,
		FetchWait:       c.FetchWait,
		NegativeTTL:     c.NegativeTTL,
		MaxParallel:     c.Debuginfod.MaxParallel,
		Limits: otlpsym.Limits{
			MaxNameBytes:      c.Limits.MaxNameBytes,
			MaxAttributeBytes: c.Limits.MaxAttributeBytes,
			MaxFramesJSON:     c.Limits.MaxFramesJSONBytes,
			MaxLogFrames:      c.Limits.MaxLogFrames,
		},
		FileLimits:    elfx.Limits{MaxFileBytes: c.Limits.MaxFileBytes, MaxDecompressedBytes: c.Limits.MaxDecompressedBytes},
		MaxIndexBytes: c.SymbolIndex.MaxBytes,
		Logger:        log,
	}
}

func (c *Config) lists(source string) bool {
	for _, s := range c.Sources {
		if s == source {
			return true
		}
	}
	return false
}

// NewDebuginfod builds the debuginfod client the configuration asks for, or
// nil when the source is not listed or no server is known. Its HTTP client
// comes from debuginfod.http (confighttp), whose auth extension, if any, is
// looked up in extensions (host.GetExtensions()).
func (c *Config) NewDebuginfod(ctx context.Context, extensions map[component.ID]component.Component, set component.TelemetrySettings) (*debuginfod.Client, error) {
	log := set.Logger
	if !c.lists(locate.SourceDebuginfod) {
		return nil, nil
	}
	urls := c.Debuginfod.URLs
	if len(urls) == 0 {
		urls = debuginfod.ParseURLs(envURLs())
	}
	if len(urls) == 0 {
		log.Info("debuginfod source listed but no server configured (debuginfod.urls or DEBUGINFOD_URLS); skipping it")
		return nil, nil
	}
	hc, err := c.Debuginfod.HTTP.ToClient(ctx, extensions, set)
	if err != nil {
		return nil, fmt.Errorf("debuginfod.http: %w", err)
	}
	return debuginfod.New(debuginfod.Config{
		URLs:            urls,
		Timeout:         c.Debuginfod.Timeout,
		CacheDir:        c.Debuginfod.CacheDir,
		MaxCacheBytes:   c.Debuginfod.MaxCacheBytes,
		MaxParallel:     c.Debuginfod.MaxParallel,
		NegativeTTL:     c.Debuginfod.NegativeTTL,
		MaxFileBytes:    c.Debuginfod.MaxFileBytes,
		MaxDownloadTime: c.Debuginfod.MaxDownloadTime,
		HTTPClient:      hc,
		Logger:          log,
	})
}

// storeSource returns the in-process source of the symbol store extension
// that symbol_store names, or nil when none is named.
func (c *Config) storeSource(host component.Host) (locate.Source, error) {
	id := c.SymbolStore
	if id.Type().String() == "" {
		return nil, nil
	}
	switch ext := host.GetExtensions()[id].(type) {
	case locate.SourceProvider:
		return ext.SymbolSource(), nil
	case locate.Locator:
		return locate.Store(ext), nil
	}
	return nil, fmt.Errorf("symbol_store: %s is not a symbolstore extension of this collector (list it under service.extensions)", id)
}

func (p *symbolizer) start(ctx context.Context, host component.Host) error {
	e, err := symbolizers.Acquire(p.cfg, func() (*sharedSym, error) { return p.cfg.newShared(ctx, host, p.set, p.log) })
	if err != nil {
		return err
	}
	p.shared, p.sym, p.client = e, e.sym, e.client
	if err := p.observeIndexes(); err != nil {
		return err
	}
	// A parser's contained panic is a bug that users should be able to
	// report: its first stack per site goes to the collector's log.
	p.unwatch = contain.Watch(p.log)
	return nil
}

// newShared builds the symbolizer of one configuration: its options, the
// symbol store and debuginfod sources, caches.
func (c *Config) newShared(ctx context.Context, host component.Host, set component.TelemetrySettings, log *zap.Logger) (*sharedSym, error) {
	opt := c.Options(log)
	store, err := c.storeSource(host)
	if err != nil {
		return nil, err
	}
	if store != nil {
		opt.Locate.Store = store
		log.Info("symbol store source enabled", zap.Stringer("extension", c.SymbolStore))
		if ix, ok := host.GetExtensions()[c.SymbolStore].(locate.IndexStore); ok && c.SymbolIndex.Enabled {
			opt.Indexes = ix
			log.Info("symbol indexes shared through the symbol store", zap.Stringer("extension", c.SymbolStore))
		}
	}
	client, err := c.NewDebuginfod(ctx, host.GetExtensions(), set)
	if err != nil {
		return nil, err
	}
	if client != nil {
		opt.Locate.Debuginfod = client
		log.Info("debuginfod enabled", zap.Strings("urls", client.URLs()), zap.String("cache_dir", client.CacheDir()))
	}
	sym, err := otlpsym.New(opt)
	if err != nil {
		if client != nil {
			client.Close()
		}
		return nil, err
	}
	return &sharedSym{sym: sym, client: client, evictions: map[string]uint64{}}, nil
}

// observeIndexes reports the symbol index counters, cumulative, as they
// move (a build ends after the batch that started it).
func (p *symbolizer) observeIndexes() error {
	p.shared.mu.Lock()
	defer p.shared.mu.Unlock()
	if p.shared.indexTelemetry {
		return nil
	}
	p.shared.indexTelemetry = true
	sym, t := p.sym, p.tel
	count := func(get func(otlpsym.IndexStats) int64) func(context.Context, metric.Int64Observer) error {
		return func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(get(sym.IndexStats()))
			return nil
		}
	}
	return errors.Join(
		t.RegisterSymbolizationObjectsParsedCallback(count(func(s otlpsym.IndexStats) int64 { return s.Parsed })),
		t.RegisterSymbolizationIndexOpenedCallback(count(func(s otlpsym.IndexStats) int64 { return s.Opened })),
		t.RegisterSymbolizationIndexWrittenCallback(count(func(s otlpsym.IndexStats) int64 { return s.Written })),
		t.RegisterSymbolizationIndexFailedCallback(count(func(s otlpsym.IndexStats) int64 { return s.Failed })),
		t.RegisterSymbolizationIndexRefusedCallback(func(_ context.Context, o metric.Int64Observer) error {
			for reason, n := range sym.IndexStats().Refused {
				o.Observe(n, metric.WithAttributes(attribute.String("reason", reason)))
			}
			return nil
		}),
	)
}

func (p *symbolizer) shutdown(context.Context) error {
	defer p.tel.Shutdown()
	if p.unwatch != nil {
		p.unwatch()
	}
	if p.shared == nil {
		return nil
	}
	p.shared = nil
	e, last := symbolizers.Release(p.cfg)
	if !last {
		return nil
	}
	var errs []error
	errs = append(errs, e.sym.Close())
	if e.client != nil {
		errs = append(errs, e.client.Close())
	}
	return errors.Join(errs...)
}

func (p *symbolizer) processProfiles(ctx context.Context, pd pprofile.Profiles) (pprofile.Profiles, error) {
	start := time.Now()
	st := p.sym.Profiles(ctx, pd)
	p.record(ctx, st, start)
	return pd, nil
}

func (p *symbolizer) processLogs(ctx context.Context, ld plog.Logs) (plog.Logs, error) {
	start := time.Now()
	st := p.sym.Logs(ctx, ld)
	p.record(ctx, st, start)
	return ld, nil
}

// record exports one batch's counters. Symbolization never fails a batch:
// problems are per frame and counted by reason.
func (p *symbolizer) record(ctx context.Context, st otlpsym.Stats, start time.Time) {
	t := p.tel
	t.SymbolizationBatchDuration.Record(ctx, time.Since(start).Seconds())
	t.SymbolizationFramesResolved.Add(ctx, st.Resolved)
	t.SymbolizationFramesSkipped.Add(ctx, st.Skipped)
	for reason, n := range st.Unresolved {
		t.SymbolizationFramesUnresolved.Add(ctx, n, metric.WithAttributes(attribute.String("reason", reason)))
	}
	for reason, n := range st.Incomplete {
		t.SymbolizationFramesIncomplete.Add(ctx, n, metric.WithAttributes(attribute.String("reason", reason)))
	}
	t.SymbolizationCacheHits.Add(ctx, st.CacheHits)
	t.SymbolizationCacheMisses.Add(ctx, st.CacheMisses)
	t.SymbolizationParserPanics.Record(ctx, contain.Count())
	caches := p.sym.Caches()
	p.shared.mu.Lock()
	for _, c := range caches {
		attrs := metric.WithAttributes(attribute.String("cache", c.Name))
		t.SymbolizationCacheBytes.Record(ctx, c.Bytes, attrs)
		t.SymbolizationCacheEntries.Record(ctx, int64(c.Entries), attrs)
		if d := c.Evictions - p.shared.evictions[c.Name]; d > 0 && c.Evictions > p.shared.evictions[c.Name] {
			t.SymbolizationCacheEvictions.Add(ctx, int64(d), attrs)
		}
		p.shared.evictions[c.Name] = c.Evictions
	}
	p.shared.mu.Unlock()
	if len(st.Unresolved) > 0 {
		p.log.Debug("frames left unresolved", zap.Any("reasons", st.Unresolved))
	}
	if p.client == nil {
		return
	}
	now := p.client.Stats()
	p.shared.mu.Lock()
	prev := p.shared.last
	p.shared.last = now
	p.shared.mu.Unlock()
	t.SymbolizationDebuginfodRequests.Add(ctx, now.Requests-prev.Requests)
	t.SymbolizationDebuginfodDownloadsInFlight.Record(ctx, now.InFlight)
	t.SymbolizationDebuginfodOldestDownload.Record(ctx, now.OldestInFlight.Seconds())
	t.SymbolizationDebuginfodBytes.Add(ctx, now.BytesFetched-prev.BytesFetched)
	for reason, n := range now.Errors {
		if d := n - prev.Errors[reason]; d > 0 {
			t.SymbolizationDebuginfodErrors.Add(ctx, d, metric.WithAttributes(attribute.String("reason", reason)))
		}
	}
	for _, d := range p.client.TakeLatencies() {
		t.SymbolizationDebuginfodLatency.Record(ctx, d.Seconds())
	}
}
