//go:build tools

// Package kube pins the commands this module builds (see go.mod).
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
