//go:build linux && (amd64 || arm64)

package sampler

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts goroutines; none may outlive its tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
