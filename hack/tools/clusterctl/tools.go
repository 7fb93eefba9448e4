//go:build tools

// Package clusterctl only records the clusterctl the Makefile builds.
package clusterctl

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
)
