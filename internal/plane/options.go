package plane

import (
	"fmt"
	"os"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Option changes the environment before its API server starts.
type Option func(*envtest.Environment) error

// WithProviderWebhooks installs the provider's webhook configurations
// (config/webhook/manifests.yaml, as `make generate` writes them), pointed
// at envtest's local serving address. Serve them with StartManager and
// ProviderWebhooks; until then the API server refuses our kinds.
func WithProviderWebhooks() Option {
	return func(env *envtest.Environment) error {
		return addWebhookConfigurations(env, "capl-", providerManifests)
	}
}

// WithEtcdDataDir keeps etcd's data in dir, which survives Stop, so that a
// later Start with the same dir finds every object again (the one-host
// management plane of internal/devplane restarts this way).
func WithEtcdDataDir(dir string) Option {
	return func(env *envtest.Environment) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: dir}
		return nil
	}
}

// WithWebhookServing points the installed webhook configurations at
// host:port instead of a random free port, for a webhook server that runs
// in another process (see WebhookCertDir for its certificate).
func WithWebhookServing(host string, port int) Option {
	return func(env *envtest.Environment) error {
		env.WebhookInstallOptions.LocalServingHost = host
		env.WebhookInstallOptions.LocalServingPort = port
		return nil
	}
}

// WithClusterAPIWebhooks installs the webhook configurations of Cluster
// API's core, kubeadm control plane and kubeadm bootstrap providers, and the
// kubeadm CRDs. Serve them with StartManager and ClusterAPIWebhooks.
func WithClusterAPIWebhooks() Option {
	return func(env *envtest.Environment) error {
		if err := WithKubeadmCRDs()(env); err != nil {
			return err
		}
		for prefix, dir := range map[string]string{
			"capi-":                   clusterAPICoreManifests,
			"capi-kubeadm-control-":   kubeadmControlPlaneManifests,
			"capi-kubeadm-bootstrap-": kubeadmBootstrapManifests,
		} {
			if err := addWebhookConfigurations(env, prefix, dir); err != nil {
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
	return func(env *envtest.Environment) error {
		for _, dir := range []string{kubeadmControlPlaneManifests, kubeadmBootstrapManifests} {
			crds, err := labelledCRDs(dir)
			if err != nil {
				return err
			}
			env.CRDInstallOptions.CRDs = append(env.CRDInstallOptions.CRDs, crds...)
		}
		return nil
	}
}

// addWebhookConfigurations adds the webhook configurations of dir to env,
// their names prefixed: every provider calls its configurations
// mutating-webhook-configuration and validating-webhook-configuration, and
// kustomize's namePrefix tells them apart in a real installation.
func addWebhookConfigurations(env *envtest.Environment, prefix, dir string) error {
	objs, err := webhookConfigurationsIn(dir)
	if err != nil {
		return err
	}
	opts := &env.WebhookInstallOptions
	for _, u := range objs {
		u.SetName(prefix + u.GetName())
		switch u.GetKind() {
		case "MutatingWebhookConfiguration":
			c := &admissionv1.MutatingWebhookConfiguration{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, c)
			opts.MutatingWebhooks = append(opts.MutatingWebhooks, c)
		case "ValidatingWebhookConfiguration":
			c := &admissionv1.ValidatingWebhookConfiguration{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, c)
			opts.ValidatingWebhooks = append(opts.ValidatingWebhooks, c)
		}
		if err != nil {
			return fmt.Errorf("reading %s's webhook configurations: %w", dir, err)
		}
	}
	return nil
}

// WithAPIServerFlags sets kube-apiserver flags, replacing envtest's values
// for the same flags (the one-host plane gives it stable service-account
// keys and an encryption configuration this way).
func WithAPIServerFlags(flags map[string]string) Option {
	return func(env *envtest.Environment) error {
		args := env.ControlPlane.GetAPIServer().Configure()
		for k, v := range flags {
			args.Set(k, v)
		}
		return nil
	}
}
