//go:generate mdatagen metadata.yaml

// Package profilingreceiver is the `profiling` receiver: it samples on-CPU
// stacks with profsym's eBPF sampler and emits OTLP profiles (and
// ProfileEvent logs) whose native frames are normalized to (build id, ELF
// address), as docs/frame-format.md specifies.
package profilingreceiver // import "github.com/profsym/profsym/receiver/profilingreceiver"
