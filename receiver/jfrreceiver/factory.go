package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/profsym/profsym/receiver/jfrreceiver/internal/metadata"
)

// NewFactory returns the jfr receiver's factory.
func NewFactory() xreceiver.Factory {
	return xreceiver.NewFactory(metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xreceiver.WithProfiles(createProfiles, metadata.ProfilesStability))
}

func createProfiles(_ context.Context, set receiver.Settings, cfg component.Config, next xconsumer.Profiles) (xreceiver.Profiles, error) {
	return newReceiver(cfg.(*Config), set, next)
}
