// Package testenv starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with Cluster API's core CRDs and the provider's CRDs installed, for
// integration tests.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
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

// UserKubeconfig returns a kubeconfig of a new user of the API server with
// the given name and groups, authenticated by a client certificate; RBAC's
// bootstrap policy grants well-known users such as
// system:kube-controller-manager their permissions.
func (e *Environment) UserKubeconfig(name string, groups ...string) ([]byte, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	return user.KubeConfig()
}

// RouteWebhooks points the webhooks of the installed webhook
// configurations whose names start with namePrefix at host:port (same path
// and CA), so that webhooks served by different processes can share one
// API server: envtest points every configuration at a single address.
func (e *Environment) RouteWebhooks(ctx context.Context, namePrefix, host string, port int) error {
	reroute := func(cc *admissionv1.WebhookClientConfig) error {
		if cc.URL == nil {
			return nil
		}
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return err
		}
		u.Host = net.JoinHostPort(host, strconv.Itoa(port))
		cc.URL = ptr.To(u.String())
		return nil
	}
	var mutating admissionv1.MutatingWebhookConfigurationList
	var validating admissionv1.ValidatingWebhookConfigurationList
	for _, l := range []client.ObjectList{&mutating, &validating} {
		if err := e.Client.List(ctx, l); err != nil {
			return err
		}
	}
	configs := map[client.Object][]*admissionv1.WebhookClientConfig{}
	for i := range mutating.Items {
		for j := range mutating.Items[i].Webhooks {
			configs[&mutating.Items[i]] = append(configs[&mutating.Items[i]], &mutating.Items[i].Webhooks[j].ClientConfig)
		}
	}
	for i := range validating.Items {
		for j := range validating.Items[i].Webhooks {
			configs[&validating.Items[i]] = append(configs[&validating.Items[i]], &validating.Items[i].Webhooks[j].ClientConfig)
		}
	}
	for obj, ccs := range configs {
		if !strings.HasPrefix(obj.GetName(), namePrefix) {
			continue
		}
		for _, cc := range ccs {
			if err := reroute(cc); err != nil {
				return fmt.Errorf("webhook configuration %s: %w", obj.GetName(), err)
			}
		}
		if err := e.Client.Update(ctx, obj); err != nil {
			return err
		}
	}
	return nil
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
