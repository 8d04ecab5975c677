//go:generate mdatagen metadata.yaml

// Package symbolstoreextension keeps the symbols of private binaries for a
// gateway: a thin adapter over internal/symstore.
package symbolstoreextension
