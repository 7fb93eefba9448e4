// Package testenv starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with Cluster API's core CRDs and the provider's CRDs installed, for
// integration tests.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// Environment is a running API server with the CRDs installed.
type Environment struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a client for Config with the provider's scheme.
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for Config, for kubectl.
	Kubeconfig string

	env *envtest.Environment
}

// ErrNoAssets is returned when KUBEBUILDER_ASSETS is unset: integration
// tests then fail rather than skip, so a misconfigured run cannot pass
// silently. `make test` sets it.
var ErrNoAssets = errors.New("KUBEBUILDER_ASSETS is unset: run the tests through `make test`, or point it at the output of hack/envtest.sh")

// Start runs kube-apiserver and etcd and installs the CRDs, changed by
// opts (see options.go). Stop it with Stop.
func Start(opts ...Option) (*Environment, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, ErrNoAssets
	}
	root := moduleRoot()
	capiCRDs, err := clusterAPICRDDir(root)
	if err != nil {
		return nil, err
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	// Tests read CRDs, and Cluster API's controllers read their contract labels.
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		Scheme: scheme,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              []string{filepath.Join(root, "config", "crd", "bases"), capiCRDs},
			ErrorIfPathMissing: true,
		},
	}
	for _, opt := range opts {
		if err := opt(env); err != nil {
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	e := &Environment{Config: cfg, env: env}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = e.Stop()
		return nil, err
	}
	if e.Kubeconfig, err = writeKubeconfig(env); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// Stop stops the API server and etcd and removes the kubeconfig.
func (e *Environment) Stop() error {
	if e.Kubeconfig != "" {
		_ = os.RemoveAll(filepath.Dir(e.Kubeconfig))
	}
	return e.env.Stop()
}

// WebhookCertDir holds the tls.crt and tls.key, signed by the CA the
// installed webhook configurations trust, that a webhook server must serve;
// it is removed by Stop.
func (e *Environment) WebhookCertDir() string { return e.env.WebhookInstallOptions.LocalServingCertDir }

// WebhookPort is the local port the installed webhook configurations call.
func (e *Environment) WebhookPort() int { return e.env.WebhookInstallOptions.LocalServingPort }

// KubectlPath is the kubectl built next to kube-apiserver by hack/envtest.sh.
func KubectlPath() string {
	return filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
}

func writeKubeconfig(env *envtest.Environment) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "envtest-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "capl-envtest-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// moduleRoot is the checkout root, found from this file's location so that
// tests in any package find config/.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// clusterAPICRDDir finds Cluster API's core CRDs in the module cache, at the
// exact version go.mod pins, so the tests install what users install.
func clusterAPICRDDir(root string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the sigs.k8s.io/cluster-api module: %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "core", "config", "crd", "bases"), nil
}
