// Package layout holds no code: its test checks that imports follow the data
// path (docs/architecture.md, "Packages"), so a package that two stages both
// need is moved below both instead of one stage reaching into another.
package layout
