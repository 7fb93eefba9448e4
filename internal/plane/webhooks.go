package plane

import (
	"context"
	"errors"
	"fmt"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	addonsv1beta1 "sigs.k8s.io/cluster-api/api/addons/v1beta1"
	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	bootstrapv1beta1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta1"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	ipamv1alpha1 "sigs.k8s.io/cluster-api/api/ipam/v1alpha1"
	ipamv1beta1 "sigs.k8s.io/cluster-api/api/ipam/v1beta1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	runtimev1alpha1 "sigs.k8s.io/cluster-api/api/runtime/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	bootstrapadmission "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	controlplaneadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterclass"
	topologycluster "sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster"
	topologymachinedeployment "sigs.k8s.io/cluster-api/core/reconcilers/topology/machinedeployment"
	topologymachineset "sigs.k8s.io/cluster-api/core/reconcilers/topology/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/feature"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/webhooks"
)

// Setup registers webhooks or controllers with a manager StartManager builds.
type Setup func(ctx context.Context, mgr ctrl.Manager) error

// Manager is a controller-runtime manager running in this process whose
// webhook server listens where the environment's webhook configurations
// point (see the With*Webhooks options).
type Manager struct {
	cancel context.CancelFunc
	done   chan error
}

// StartManager builds a manager with Cluster API's cache and client
// options and a scheme holding Cluster API's kinds (core, runtime
// extensions, kubeadm; both API versions) and the provider's, runs setups on it, starts it and returns
// once its caches are in sync and its webhook server answers.
func (e *Environment) StartManager(setups ...Setup) (*Manager, error) {
	scheme, err := fullScheme()
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  setup.ManagerCacheOptions(scheme, capiControllerName, "", 10*time.Minute),
		Client:                 setup.ManagerClientOptions(),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    e.webhookHost,
			Port:    e.webhookPort,
			CertDir: e.webhookCertDir,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for _, s := range setups {
		if err := s(ctx, mgr); err != nil {
			cancel()
			return nil, err
		}
	}
	m := &Manager{cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(ctx) }()

	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	if !mgr.GetCache().WaitForCacheSync(waitCtx) {
		_ = m.Stop()
		return nil, errors.New("the manager's cache did not sync")
	}
	started := mgr.GetWebhookServer().StartedChecker()
	for started(nil) != nil {
		select {
		case <-waitCtx.Done():
			_ = m.Stop()
			return nil, errors.New("the webhook server did not start")
		case err := <-m.done:
			// The manager gave up (e.g. its webhook port was taken): say why
			// rather than wait out the minute.
			m.done <- err
			return nil, fmt.Errorf("the manager stopped before its webhook server served: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return m, nil
}

// Stop stops the manager and waits for it.
func (m *Manager) Stop() error {
	m.cancel()
	return <-m.done
}

// NewClient returns a client of the environment whose scheme knows Cluster
// API's core and kubeadm kinds besides the provider's.
func (e *Environment) NewClient() (client.Client, error) {
	scheme, err := fullScheme()
	if err != nil {
		return nil, err
	}
	return client.New(e.Config, client.Options{Scheme: scheme})
}

func fullScheme() (*runtime.Scheme, error) {
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	for _, add := range []func(*runtime.Scheme) error{
		apiextensionsv1.AddToScheme,
		storagev1.AddToScheme,
		clusterv1beta1.AddToScheme, runtimev1alpha1.AddToScheme, runtimev1.AddToScheme,
		addonsv1beta1.AddToScheme, addonsv1.AddToScheme,
		ipamv1alpha1.AddToScheme, ipamv1beta1.AddToScheme, ipamv1.AddToScheme,
		bootstrapv1.AddToScheme, bootstrapv1beta1.AddToScheme,
		controlplanev1.AddToScheme, controlplanev1beta1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// ProviderWebhooks serves the provider's webhooks (install their
// configurations with WithProviderWebhooks) as the manager wires them:
// volumes (nil to skip) and the manager's client.
func ProviderWebhooks(volumes webhooks.VolumeInspector) Setup {
	return ProviderWebhooksWithPolicy(volumes, nil)
}

// ProviderWebhooksWithPolicy is ProviderWebhooks enforcing the operator's
// policy too (nil: none of it), as the manager does.
func ProviderWebhooksWithPolicy(volumes webhooks.VolumeInspector, policy *tenancy.Policy) Setup {
	return func(_ context.Context, mgr ctrl.Manager) error {
		return webhooks.SetupWithManager(mgr, webhooks.Options{Volumes: volumes, Reader: mgr.GetClient(), LiveReader: mgr.GetAPIReader(), Tenancy: policy})
	}
}

// enableClusterTopology turns on Cluster API's ClusterTopology feature gate
// in this process, as `clusterctl init` with CLUSTER_TOPOLOGY=true does for
// Cluster API's managers: its webhooks refuse ClusterClasses without it.
func enableClusterTopology() error {
	return feature.MutableGates.Set(string(feature.ClusterTopology) + "=true")
}

// ClusterAPIWebhooks serves the webhooks of Cluster API's core, kubeadm
// control plane and kubeadm bootstrap managers (install their
// configurations with WithClusterAPIWebhooks), all that their main.go's
// set up, with ClusterTopology on.
func ClusterAPIWebhooks(_ context.Context, mgr ctrl.Manager) error {
	if err := enableClusterTopology(); err != nil {
		return err
	}
	for _, s := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
		&coreadmission.ClusterClass{Client: mgr.GetClient()},
		&coreadmission.Cluster{Client: mgr.GetClient()},
		&coreadmission.Machine{},
		&coreadmission.MachineSet{},
		&coreadmission.MachineDeployment{},
		&coreadmission.MachineDrainRule{},
		&coreadmission.MachinePool{},
		&coreadmission.ClusterResourceSet{},
		&coreadmission.ClusterResourceSetBinding{},
		&coreadmission.MachineHealthCheck{},
		&coreadmission.ExtensionConfig{},
		// core/main.go reads IPAddressClaims uncached.
		&coreadmission.IPAddress{Client: mgr.GetAPIReader()},
		&coreadmission.IPAddressClaim{},
		&controlplaneadmission.KubeadmControlPlane{},
		&controlplaneadmission.ScaleValidator{Client: mgr.GetClient()},
		&controlplaneadmission.KubeadmControlPlaneTemplate{},
		&bootstrapadmission.KubeadmConfig{},
		&bootstrapadmission.KubeadmConfigTemplate{},
	} {
		if err := s.SetupWebhookWithManager(mgr); err != nil {
			return fmt.Errorf("setting up a Cluster API webhook: %w", err)
		}
	}
	return nil
}

// ClusterAPITopology runs Cluster API's ClusterClass and managed topology
// controllers (see ClusterAPITopologyReconcilers) with a ClusterCache of
// their own.
func ClusterAPITopology(ctx context.Context, mgr ctrl.Manager) error {
	clusterCache, err := newClusterCache(ctx, mgr, setup.ClusterCacheCacheOptions(), setup.ClusterCacheClientOptions(capiControllerName, 20, 30))
	if err != nil {
		return err
	}
	return ClusterAPITopologyReconcilers(ctx, mgr, clusterCache)
}

// ClusterAPITopologyReconcilers sets up what core/main.go runs when the
// ClusterTopology gate is on (it turns the gate on): the ClusterClass
// controller publishes a class's variables; the topology controllers
// create and update a class-based Cluster's LibvirtCluster, control plane,
// templates and MachineDeployments (making the server-side-apply dry-run
// requests the template webhooks must allow) and clean up the templates of
// its MachineDeployments and MachineSets.
func ClusterAPITopologyReconcilers(ctx context.Context, mgr ctrl.Manager, clusterCache clustercache.ClusterCache) error {
	if err := enableClusterTopology(); err != nil {
		return err
	}
	return setupReconcilers(ctx, mgr, map[string]reconciler{
		"ClusterClass": &clusterclass.Reconciler{Client: mgr.GetClient()},
		"ClusterTopology": &topologycluster.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: clusterCache,
		},
		"MachineDeploymentTopology": &topologymachinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()},
		"MachineSetTopology":        &topologymachineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()},
	})
}
