package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/profsym/profsym/receiver/profilingreceiver/internal/metadata"
)

// NewFactory returns the profiling receiver's factory.
func NewFactory() xreceiver.Factory {
	return xreceiver.NewFactory(metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xreceiver.WithProfiles(createProfiles, metadata.ProfilesStability),
		xreceiver.WithLogs(createLogs, metadata.LogsStability))
}

func createProfiles(_ context.Context, set receiver.Settings, cfg component.Config, next xconsumer.Profiles) (xreceiver.Profiles, error) {
	return get(cfg.(*Config), set, func(r *profilingReceiver) { r.profiles = next })
}

func createLogs(_ context.Context, set receiver.Settings, cfg component.Config, next consumer.Logs) (receiver.Logs, error) {
	return get(cfg.(*Config), set, func(r *profilingReceiver) { r.logs = next })
}
