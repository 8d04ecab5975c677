package symboluploadprocessor

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper/xprocessorhelper"
	"go.opentelemetry.io/collector/processor/xprocessor"

	"github.com/profsym/profsym/processor/symboluploadprocessor/internal/metadata"
)

// The processor only reads the profiles it forwards.
var capabilities = consumer.Capabilities{MutatesData: false}

// NewFactory returns the factory of the symbol upload processor.
func NewFactory() xprocessor.Factory {
	return xprocessor.NewFactory(metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xprocessor.WithProfiles(createProfiles, metadata.ProfilesStability))
}

func createProfiles(ctx context.Context, set processor.Settings, cfg component.Config, next xconsumer.Profiles) (xprocessor.Profiles, error) {
	p, err := newUploader(set, cfg.(*Config))
	if err != nil {
		return nil, err
	}
	return xprocessorhelper.NewProfiles(ctx, set, cfg, next, p.processProfiles,
		xprocessorhelper.WithCapabilities(capabilities),
		xprocessorhelper.WithStart(p.start),
		xprocessorhelper.WithShutdown(p.shutdown))
}
