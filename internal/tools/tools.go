//go:build tools

// Package tools pins the code generators profsym uses (mdatagen, the
// collector builder) in a module of their own, so their dependencies never
// mix with the distribution's.
package tools

import (
	_ "go.opentelemetry.io/collector/cmd/builder"
	_ "go.opentelemetry.io/collector/cmd/mdatagen"
)
