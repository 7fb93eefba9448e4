//go:build tools

// Package critools only records what images/node/build-binaries.sh builds.
package critools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
