//go:build race

package table

// raceEnabled: under the race detector sync.Pool drops a quarter of what
// is put back on purpose, so fmt's printer pool allocates a new printer
// now and then: one allocation an allocation count cannot control.
const raceEnabled = true
