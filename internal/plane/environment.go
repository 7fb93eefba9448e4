package plane

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

	controlPlane   *controlPlane
	webhookCertDir string
	webhookHost    string
	webhookPort    int
}

// StartEnvironment runs kube-apiserver and etcd of the assets directory
// (FindAssets) and installs the CRDs, changed by opts. Stop it with Stop.
func StartEnvironment(assets string, opts ...Option) (e *Environment, err error) {
	if err := checkAssets(assets); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoAssets, err)
	}
	s := &settings{controlPlane: controlPlaneSpec{assets: assets}, webhookHost: "127.0.0.1"}
	for _, dir := range []string{providerManifests, clusterAPICoreManifests} {
		c, err := crdsIn(dir)
		if err != nil {
			return nil, err
		}
		s.crds = append(s.crds, c...)
	}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	if s.webhookPort == 0 {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		s.webhookPort = ports[0]
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	// Tests read CRDs, and Cluster API's controllers read their contract labels.
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}

	ctx := context.Background()
	cp, err := startControlPlane(ctx, s.controlPlane)
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	e = &Environment{Config: cp.admin, controlPlane: cp, webhookHost: s.webhookHost, webhookPort: s.webhookPort}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Stop())
		}
	}()
	if e.Client, err = client.New(cp.admin, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if err := installCRDs(ctx, e.Client, cp.admin, s.crds); err != nil {
		return nil, err
	}
	caBundle, err := e.writeWebhookCertificate(s.webhookHost)
	if err != nil {
		return nil, err
	}
	if err := installWebhookConfigurations(ctx, e.Client, s.webhooks, tcpAddress(s.webhookHost, s.webhookPort), caBundle); err != nil {
		return nil, err
	}
	if e.Kubeconfig, err = e.writeKubeconfig(); err != nil {
		return nil, err
	}
	return e, nil
}

// Stop stops the API server and etcd and removes the kubeconfig and the
// certificates.
func (e *Environment) Stop() error {
	return e.controlPlane.stop()
}

// WebhookCertDir holds the tls.crt and tls.key, signed by the CA the
// installed webhook configurations trust, that a webhook server must serve;
// it is removed by Stop.
func (e *Environment) WebhookCertDir() string { return e.webhookCertDir }

// WebhookPort is the local port the installed webhook configurations call.
func (e *Environment) WebhookPort() int { return e.webhookPort }

// UserKubeconfig returns a kubeconfig of a new user of the API server with
// the given name and groups, authenticated by a client certificate; RBAC's
// bootstrap policy grants well-known users such as
// system:kube-controller-manager their permissions.
func (e *Environment) UserKubeconfig(name string, groups ...string) ([]byte, error) {
	cfg, err := e.controlPlane.userConfig(name, groups...)
	if err != nil {
		return nil, err
	}
	return kubeconfig(cfg, name)
}

// writeWebhookCertificate issues the webhook servers' certificate for host
// under a new authority, writes it to WebhookCertDir, and returns the
// authority's certificate for the configurations' caBundle.
func (e *Environment) writeWebhookCertificate(host string) ([]byte, error) {
	ca, err := newAuthority("capl-webhook-ca")
	if err != nil {
		return nil, err
	}
	pair, err := ca.servingCertificate(host, "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.controlPlane.workDir, "webhook-serving")
	if err := writeKeyPair(dir, pair); err != nil {
		return nil, err
	}
	e.webhookCertDir = dir
	return ca.certPEM, nil
}

// writeKubeconfig writes the administrator's kubeconfig into the work
// directory.
func (e *Environment) writeKubeconfig() (string, error) {
	data, err := kubeconfig(e.Config, "capl-admin")
	if err != nil {
		return "", err
	}
	path := filepath.Join(e.controlPlane.workDir, "kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// RouteWebhooks points the webhooks of the installed webhook
// configurations whose names start with namePrefix at host:port (same path
// and CA), so that webhooks served by different processes can share one
// API server: StartEnvironment points every configuration at one address.
func (e *Environment) RouteWebhooks(ctx context.Context, namePrefix, host string, port int) error {
	var mutating admissionv1.MutatingWebhookConfigurationList
	var validating admissionv1.ValidatingWebhookConfigurationList
	for _, l := range []client.ObjectList{&mutating, &validating} {
		if err := e.Client.List(ctx, l); err != nil {
			return err
		}
	}
	var configs []client.Object
	for i := range mutating.Items {
		configs = append(configs, &mutating.Items[i])
	}
	for i := range validating.Items {
		configs = append(configs, &validating.Items[i])
	}
	for _, obj := range configs {
		if !strings.HasPrefix(obj.GetName(), namePrefix) {
			continue
		}
		for _, cc := range webhookClientConfigs(obj) {
			if cc.URL == nil {
				continue
			}
			u, err := url.Parse(*cc.URL)
			if err != nil {
				return fmt.Errorf("webhook configuration %s: %w", obj.GetName(), err)
			}
			u.Host = tcpAddress(host, port)
			cc.URL = ptr.To(u.String())
		}
		if err := e.Client.Update(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}
