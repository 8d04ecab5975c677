//go:build !linux

package addrmap

import (
	"errors"
	"os"
)

// ErrQueryUnsupported: only Linux has PROCMAP_QUERY.
var ErrQueryUnsupported = errors.New("PROCMAP_QUERY not supported")

// QueryExec needs Linux; it always returns ErrQueryUnsupported.
func QueryExec(*os.File, func(Mapping) error) error { return ErrQueryUnsupported }
