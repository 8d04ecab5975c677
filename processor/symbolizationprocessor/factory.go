//go:generate mdatagen metadata.yaml

// Package symbolizationprocessor resolves raw native frames of profiles and
// ProfileEvent logs in the pipeline: a thin adapter over internal/otlp/otlpsym.
package symbolizationprocessor

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"
	"go.opentelemetry.io/collector/processor/processorhelper/xprocessorhelper"
	"go.opentelemetry.io/collector/processor/xprocessor"

	"github.com/profsym/profsym/processor/symbolizationprocessor/internal/metadata"
)

// Symbolization rewrites locations and log attributes in place.
var capabilities = consumer.Capabilities{MutatesData: true}

// NewFactory returns the factory of the symbolization processor.
func NewFactory() xprocessor.Factory {
	return xprocessor.NewFactory(metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xprocessor.WithProfiles(createProfiles, metadata.ProfilesStability),
		xprocessor.WithLogs(createLogs, metadata.LogsStability))
}

func createProfiles(ctx context.Context, set processor.Settings, cfg component.Config, next xconsumer.Profiles) (xprocessor.Profiles, error) {
	p, err := newSymbolizer(set, cfg.(*Config))
	if err != nil {
		return nil, err
	}
	return xprocessorhelper.NewProfiles(ctx, set, cfg, next, p.processProfiles,
		xprocessorhelper.WithCapabilities(capabilities),
		xprocessorhelper.WithStart(p.start),
		xprocessorhelper.WithShutdown(p.shutdown))
}

func createLogs(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	p, err := newSymbolizer(set, cfg.(*Config))
	if err != nil {
		return nil, err
	}
	return processorhelper.NewLogs(ctx, set, cfg, next, p.processLogs,
		processorhelper.WithCapabilities(capabilities),
		processorhelper.WithStart(p.start),
		processorhelper.WithShutdown(p.shutdown))
}
