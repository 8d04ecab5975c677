//go:generate mdatagen metadata.yaml

// Package symboluploadprocessor is a pass-through processor for the agent's
// profiles pipeline that uploads the symbols of the binaries the profiles
// name to the gateway's symbol store: a thin adapter over
// internal/host/symupload.
package symboluploadprocessor
