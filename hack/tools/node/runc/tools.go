//go:build tools

// Package runc only records what images/node/build-binaries.sh builds.
package runc

import (
	_ "github.com/opencontainers/runc"
)
