package manager

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/flags"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/controllers"
)

// NewScheme returns a scheme holding every kind the provider reads or writes.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		clusterv1.AddToScheme,
		infrav1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// New builds a manager with the provider's controllers registered; the
// caller starts it.
func New(restConfig *rest.Config, opts Options) (ctrl.Manager, error) {
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	tlsOptions, metricsOptions, err := flags.GetManagerOptions(opts.Diagnostics)
	if err != nil {
		return nil, fmt.Errorf("invalid diagnostics flags: %w", err)
	}

	var namespaces map[string]cache.Config
	if opts.WatchNamespace != "" {
		namespaces = map[string]cache.Config{opts.WatchNamespace: {}}
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                     scheme,
		LeaderElection:             opts.LeaderElect,
		LeaderElectionID:           opts.LeaderElectionID,
		LeaderElectionNamespace:    opts.LeaderElectionNamespace,
		LeaderElectionResourceLock: resourcelock.LeasesResourceLock,
		LeaseDuration:              &opts.LeaseDuration,
		RenewDeadline:              &opts.RenewDeadline,
		RetryPeriod:                &opts.RetryPeriod,
		HealthProbeBindAddress:     opts.HealthAddr,
		PprofBindAddress:           opts.ProfilerAddr,
		Metrics:                    *metricsOptions,
		Cache: cache.Options{
			DefaultNamespaces: namespaces,
			SyncPeriod:        &opts.SyncPeriod,
		},
		WebhookServer: webhook.NewServer(webhook.Options{
			Port:    opts.WebhookPort,
			CertDir: opts.WebhookCertDir,
			TLSOpts: tlsOptions,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}

	if err := (&controllers.LibvirtClusterReconciler{
		Client:           mgr.GetClient(),
		WatchFilterValue: opts.WatchFilterValue,
	}).SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: opts.ClusterConcurrency}); err != nil {
		return nil, fmt.Errorf("setting up the LibvirtCluster controller: %w", err)
	}
	if err := (&controllers.LibvirtMachineReconciler{
		Client:           mgr.GetClient(),
		WatchFilterValue: opts.WatchFilterValue,
	}).SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: opts.MachineConcurrency}); err != nil {
		return nil, fmt.Errorf("setting up the LibvirtMachine controller: %w", err)
	}

	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
