//go:build tools

// Package coredns only records what images/node/build-binaries.sh builds.
package coredns

import (
	_ "github.com/coredns/coredns"
)
