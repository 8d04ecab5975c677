// Package config holds the tests of the collector configurations shipped
// in this directory: each validates with the built distribution, and
// default.yaml (make run) keeps its output bounded.
package config
