package symbolstoreextension

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/profsym/profsym/extension/symbolstoreextension/internal/metadata"
)

// NewFactory returns the factory of the symbol store extension.
func NewFactory() extension.Factory {
	return extension.NewFactory(metadata.Type,
		func() component.Config { return createDefaultConfig() },
		create, metadata.ExtensionStability)
}

func create(_ context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
	return newStore(set, cfg.(*Config))
}
