//go:build !linux

package main

// readSysLimits knows no limits outside Linux: the hold keeps its budget.
func readSysLimits() sysLimits { return sysLimits{addressSpace: -1, cgroup: -1} }
