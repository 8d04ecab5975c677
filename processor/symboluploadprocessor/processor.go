package symboluploadprocessor

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/elfx/keepdebug"
	pframe "github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/symupload"
	"github.com/profsym/profsym/internal/symstore"
	"github.com/profsym/profsym/processor/symboluploadprocessor/internal/metadata"
)

type uploader struct {
	cfg *Config
	set processor.Settings
	tel *metadata.TelemetryBuilder
	up  *symupload.Uploader
}

func newUploader(set processor.Settings, cfg *Config) (*uploader, error) {
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	return &uploader{cfg: cfg, set: set, tel: tel}, nil
}

func (p *uploader) start(ctx context.Context, host component.Host) error {
	if !p.cfg.Enabled {
		p.set.Logger.Info("symbol upload disabled; profiles pass through")
		return nil
	}
	ep, err := p.cfg.endpoint()
	if err != nil {
		return err
	}
	cc := p.cfg.ClientConfig
	cc.Endpoint = ep
	hc, err := cc.ToClient(ctx, host.GetExtensions(), p.set.TelemetrySettings)
	if err != nil {
		return fmt.Errorf("symbol store client: %w", err)
	}
	client, err := symstore.NewClient(ep, "", hc)
	if err != nil {
		return err
	}
	if p.cfg.MaxBandwidth > 0 {
		client.Limiter = symstore.NewLimiter(p.cfg.MaxBandwidth, 0)
	}
	comp := keepdebug.Zstd
	switch p.cfg.Compression {
	case "zlib":
		comp = keepdebug.Zlib
	case "none":
		comp = keepdebug.None
	}
	p.up = symupload.New(symupload.Config{
		Client:         client,
		DebugDirs:      p.cfg.DebugDirectories,
		Exclude:        p.cfg.Exclude,
		MaxConcurrent:  p.cfg.MaxConcurrentUploads,
		MaxFileBytes:   p.cfg.MaxFileSize,
		QueryInterval:  p.cfg.QueryInterval,
		InitialBackoff: p.cfg.Retry.InitialInterval,
		MaxBackoff:     p.cfg.Retry.MaxInterval,
		Compression:    comp,
		ScratchDir:     p.cfg.ScratchDirectory,
		Logger:         p.set.Logger,
		Observer:       observer{p.tel},
	})
	if err := p.tel.RegisterSymboluploadPendingCallback(func(_ context.Context, o metric.Int64Observer) error {
		q, r, _ := p.up.Stats()
		o.Observe(int64(q + r))
		return nil
	}); err != nil {
		return err
	}
	p.up.Start()
	p.set.Logger.Info("symbol upload enabled", zap.String("endpoint", ep),
		zap.Int64("max_bandwidth", p.cfg.MaxBandwidth), zap.Strings("exclude", p.cfg.Exclude))
	return nil
}

func (p *uploader) shutdown(context.Context) error {
	if p.up != nil {
		p.up.Stop()
	}
	p.tel.Shutdown()
	return nil
}

// processProfiles forwards pd untouched after noting, for each mapping
// whose build id the uploader has not handled yet, which processes map it.
// A mapping is known by its GNU build id, or by its Go build id when it has
// no GNU one (Go before 1.24). In the steady state (every id known) it
// reads only the mapping table.
func (p *uploader) processProfiles(_ context.Context, pd pprofile.Profiles) (pprofile.Profiles, error) {
	if p.up == nil {
		return pd, nil
	}
	dict := pd.Dictionary()
	strs, attrs, maps := dict.StringTable(), dict.AttributeTable(), dict.MappingTable()
	var fresh map[int32]ids // mapping index -> its ids
	for i := 0; i < maps.Len(); i++ {
		m := maps.At(i)
		var gnu, goID string
		for _, ai := range m.AttributeIndices().All() {
			if int(ai) >= attrs.Len() {
				continue
			}
			kv := attrs.At(int(ai))
			k := int(kv.KeyStrindex())
			if k >= strs.Len() {
				continue
			}
			switch strs.At(k) {
			case pframe.AttrBuildIDGNU:
				gnu = kv.Value().Str()
			case pframe.AttrBuildIDGo:
				goID = kv.Value().Str()
			}
		}
		key := gnu
		if key == "" && goID != "" {
			// Rare (old Go binaries): the key costs an allocation.
			k, err := symstore.GoKey(goID)
			if err != nil {
				continue
			}
			key = k.String()
		}
		if key != "" && !p.up.Known(key) {
			if fresh == nil {
				fresh = map[int32]ids{}
			}
			fresh[int32(i)] = ids{gnu, goID}
		}
	}
	if len(fresh) == 0 {
		return pd, nil
	}
	type seenKey struct {
		mapping int32
		pid     int64
	}
	seen := map[seenKey]bool{}
	stacks, locs := dict.StackTable(), dict.LocationTable()
	for _, rp := range pd.ResourceProfiles().All() {
		var pid int64
		if v, ok := rp.Resource().Attributes().Get(pframe.AttrPID); ok {
			pid = v.Int()
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					spid := pid
					if spid == 0 {
						spid = samplePID(s, attrs, strs)
					}
					si := int(s.StackIndex())
					if si < 0 || si >= stacks.Len() {
						continue
					}
					for _, li := range stacks.At(si).LocationIndices().All() {
						if int(li) < 0 || int(li) >= locs.Len() {
							continue
						}
						mi := locs.At(int(li)).MappingIndex()
						id, ok := fresh[mi]
						if !ok || seen[seenKey{mi, spid}] {
							continue
						}
						seen[seenKey{mi, spid}] = true
						m := maps.At(int(mi))
						path := ""
						if fi := int(m.FilenameStrindex()); fi < strs.Len() {
							path = strs.At(fi)
						}
						p.up.Observe(symupload.Candidate{PID: spid, Path: path, BuildID: id.gnu, GoBuildID: id.goID,
							Start: m.MemoryStart(), Limit: m.MemoryLimit()})
					}
				}
			}
		}
	}
	return pd, nil
}

// ids are a mapping's identities the uploader keys files by.
type ids struct{ gnu, goID string }

// samplePID reads process.pid from a sample's attributes (profiles that
// keep one resource for many processes).
func samplePID(s pprofile.Sample, attrs pprofile.KeyValueAndUnitSlice, strs interface {
	At(int) string
	Len() int
}) int64 {
	for _, ai := range s.AttributeIndices().All() {
		if int(ai) >= attrs.Len() {
			continue
		}
		kv := attrs.At(int(ai))
		if k := int(kv.KeyStrindex()); k < strs.Len() && strs.At(k) == pframe.AttrPID {
			return kv.Value().Int()
		}
	}
	return 0
}

// observer turns uploader events into metrics.
type observer struct{ tel *metadata.TelemetryBuilder }

func reasonAttr(r string) metric.AddOption {
	return metric.WithAttributes(attribute.String("reason", r))
}

func (o observer) Attempted() { o.tel.SymboluploadUploadsAttempted.Add(context.Background(), 1) }
func (o observer) Stored(n int64) {
	o.tel.SymboluploadUploadsStored.Add(context.Background(), 1)
	o.tel.SymboluploadBytesSent.Add(context.Background(), n)
}
func (o observer) Deduped() { o.tel.SymboluploadUploadsDeduped.Add(context.Background(), 1) }
func (o observer) Failed(r string) {
	o.tel.SymboluploadUploadsFailed.Add(context.Background(), 1, reasonAttr(r))
}
func (o observer) Skipped(r string) {
	o.tel.SymboluploadUploadsSkipped.Add(context.Background(), 1, reasonAttr(r))
}
