package plane

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
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

// Environment is a running kube-apiserver and etcd with the provider's and
// Cluster API's core CRDs installed.
type Environment struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a client for Config with the provider's scheme.
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for Config, for kubectl.
	Kubeconfig string

	env *envtest.Environment
}

// StartEnvironment runs kube-apiserver and etcd of the assets directory
// (FindAssets) and installs the CRDs, changed by opts. Stop it with Stop.
func StartEnvironment(assets string, opts ...Option) (*Environment, error) {
	if err := checkAssets(assets); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoAssets, err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, dir := range []string{providerManifests, clusterAPICoreManifests} {
		c, err := crdsIn(dir)
		if err != nil {
			return nil, err
		}
		crds = append(crds, c...)
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
		Scheme:                scheme,
		BinaryAssetsDirectory: assets,
		CRDInstallOptions:     envtest.CRDInstallOptions{CRDs: crds},
	}
	for _, opt := range opts {
		if err := opt(env); err != nil {
			return nil, err
		}
	}
	// Explicit paths: envtest would otherwise prefer $KUBEBUILDER_ASSETS
	// to the directory it was given.
	env.ControlPlane.GetAPIServer().Path = filepath.Join(assets, "kube-apiserver")
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Path = filepath.Join(assets, "etcd")
	env.ControlPlane.KubectlPath = filepath.Join(assets, "kubectl")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
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
