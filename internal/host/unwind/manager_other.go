//go:build !linux || !(amd64 || arm64)

package unwind

import "github.com/profsym/profsym/internal/host/normalize"

// Manager is a stand-in where the sampler cannot run: it holds nothing.
type Manager struct{}

func (*Manager) Track(*normalize.Process) error { return nil }
func (*Manager) Forget(int)                     {}
func (*Manager) Request(uint32)                 {}
func (*Manager) Poll()                          {}
func (*Manager) Tracked(int) bool               { return false }
func (*Manager) Stats() Stats                   { return Stats{} }
func (*Manager) Close()                         {}
func (*Manager) SetRuntime(int, Runtime) error  { return nil }
