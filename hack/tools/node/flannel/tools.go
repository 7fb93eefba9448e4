//go:build tools

// Package flannel only records what images/node/build-binaries.sh builds.
package flannel

import (
	_ "github.com/flannel-io/flannel"
)
