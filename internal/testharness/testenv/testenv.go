// Package testenv is the integration tests' harness over internal/plane: an
// API server with the CRDs installed, started from the binaries `make test`
// points KUBEBUILDER_ASSETS at, and the provider's manager in process. Only
// tests import it (TestProductCodeImportsNoTestHarness).
package testenv

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// Environment is a running API server with the CRDs installed.
type Environment struct {
	*plane.Environment
}

// ErrNoAssets is returned when KUBEBUILDER_ASSETS is unset: integration
// tests then fail rather than skip, so a misconfigured run cannot pass
// silently. `make test` sets it.
var ErrNoAssets = errors.New("KUBEBUILDER_ASSETS is unset: run the tests through `make test`, or point it at the output of hack/envtest.sh")

// Start runs kube-apiserver and etcd of $KUBEBUILDER_ASSETS and installs
// the CRDs, changed by opts. Stop it with Stop.
func Start(opts ...plane.Option) (*Environment, error) {
	assets := os.Getenv(plane.AssetsEnv)
	if assets == "" {
		return nil, ErrNoAssets
	}
	e, err := plane.StartEnvironment(assets, opts...)
	if err != nil {
		return nil, err
	}
	return &Environment{Environment: e}, nil
}

// KubectlPath is the kubectl built next to kube-apiserver by hack/envtest.sh.
func KubectlPath() string {
	return filepath.Join(os.Getenv(plane.AssetsEnv), "kubectl")
}
