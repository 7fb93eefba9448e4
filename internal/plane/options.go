package plane

import (
	"fmt"
	"maps"
	"os"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Option changes the environment before its API server starts.
type Option func(*settings) error

// settings are what StartEnvironment runs and installs.
type settings struct {
	controlPlane controlPlaneSpec
	crds         []*apiextensionsv1.CustomResourceDefinition
	// webhooks are webhook configurations as generated, calling a
	// Service; StartEnvironment points them at webhookHost:webhookPort
	// (0: a free port).
	webhooks    []client.Object
	webhookHost string
	webhookPort int
}

// WithProviderWebhooks installs the provider's webhook configurations
// (config/webhook/manifests.yaml, as `make generate` writes them), pointed
// at the environment's webhook address (WebhookPort). Serve them with StartManager and
// ProviderWebhooks; until then the API server refuses our kinds.
func WithProviderWebhooks() Option {
	return func(s *settings) error {
		return addWebhookConfigurations(s, "capl-", providerManifests)
	}
}

// WithEtcdDataDir keeps etcd's data in dir, which survives Stop, so that a
// later Start with the same dir finds every object again (the one-host
// management plane of internal/devplane restarts this way).
func WithEtcdDataDir(dir string) Option {
	return func(s *settings) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		s.controlPlane.etcdDataDir = dir
		return nil
	}
}

// WithEtcdCertDir keeps etcd's certificates (its authority's, its serving
// certificate and kube-apiserver's client certificate) in dir across
// starts, making a new set when one is missing, invalid or near its
// expiry; without it each start makes a set in the work directory.
func WithEtcdCertDir(dir string) Option {
	return func(s *settings) error {
		s.controlPlane.etcdCertDir = dir
		return nil
	}
}

// WithWebhookServing points the installed webhook configurations at
// host:port instead of a random free port, for a webhook server that runs
// in another process (see WebhookCertDir for its certificate).
func WithWebhookServing(host string, port int) Option {
	return func(s *settings) error {
		s.webhookHost, s.webhookPort = host, port
		return nil
	}
}

// WithClusterAPIWebhooks installs the webhook configurations of Cluster
// API's core, kubeadm control plane and kubeadm bootstrap providers, and the
// kubeadm CRDs. Serve them with StartManager and ClusterAPIWebhooks.
func WithClusterAPIWebhooks() Option {
	return func(s *settings) error {
		if err := WithKubeadmCRDs()(s); err != nil {
			return err
		}
		for prefix, dir := range map[string]string{
			"capi-":                   clusterAPICoreManifests,
			"capi-kubeadm-control-":   kubeadmControlPlaneManifests,
			"capi-kubeadm-bootstrap-": kubeadmBootstrapManifests,
		} {
			if err := addWebhookConfigurations(s, prefix, dir); err != nil {
				return err
			}
		}
		return nil
	}
}

// WithKubeadmCRDs installs the CRDs of Cluster API's kubeadm control plane
// and bootstrap providers (KubeadmControlPlane, KubeadmConfig and their
// templates) from the module go.mod pins, with the contract labels their
// kustomization adds (the topology controller looks the labels up).
func WithKubeadmCRDs() Option {
	return func(s *settings) error {
		for _, dir := range []string{kubeadmControlPlaneManifests, kubeadmBootstrapManifests} {
			crds, err := labelledCRDs(dir)
			if err != nil {
				return err
			}
			s.crds = append(s.crds, crds...)
		}
		return nil
	}
}

// addWebhookConfigurations adds the webhook configurations of dir to s,
// their names prefixed: every provider calls its configurations
// mutating-webhook-configuration and validating-webhook-configuration, and
// kustomize's namePrefix tells them apart in a real installation.
func addWebhookConfigurations(s *settings, prefix, dir string) error {
	objs, err := webhookConfigurationsIn(dir)
	if err != nil {
		return err
	}
	for _, u := range objs {
		u.SetName(prefix + u.GetName())
		var c client.Object
		switch u.GetKind() {
		case "MutatingWebhookConfiguration":
			c = &admissionv1.MutatingWebhookConfiguration{}
		case "ValidatingWebhookConfiguration":
			c = &admissionv1.ValidatingWebhookConfiguration{}
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, c); err != nil {
			return fmt.Errorf("reading %s's webhook configurations: %w", dir, err)
		}
		s.webhooks = append(s.webhooks, c)
	}
	return nil
}

// WithAPIServerFlags sets kube-apiserver flags, replacing the defaults
// for the same flags (the one-host plane gives it stable service-account
// keys and an encryption configuration this way).
func WithAPIServerFlags(flags map[string]string) Option {
	return func(s *settings) error {
		if s.controlPlane.apiServerFlags == nil {
			s.controlPlane.apiServerFlags = map[string]string{}
		}
		maps.Copy(s.controlPlane.apiServerFlags, flags)
		return nil
	}
}
