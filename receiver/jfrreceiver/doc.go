//go:generate mdatagen metadata.yaml

// Package jfrreceiver is the `jfr` receiver: an HTTP server (confighttp:
// TLS, auth, body size limit) speaking the Datadog profiling intake and
// Pyroscope's JFR ingest, so a Java profiler configured for either backend
// can send to the collector unchanged. Each uploaded recording becomes OTLP
// profiles through internal/otlp/jfrconv (docs/jfr.md).
package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"
