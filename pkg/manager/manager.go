package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/flags"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/controllers"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/loadbalancer"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/webhooks"
)

// NewScheme returns a scheme holding every kind the provider reads or writes.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		clusterv1.AddToScheme,
		ipamv1.AddToScheme,
		infrav1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// Wiring is what New derives from Options beyond the manager itself; tests
// inject their own (e.g. a Host wrapping the real one to simulate crashes).
type Wiring struct {
	// Host is the libvirt host the machine controller manages.
	Host virt.Host
	// HostName names Host in status.domain.host.
	HostName string
	// MachineShutdownTimeout bounds a machine's graceful shutdown on
	// delete; zero means the controller's default.
	MachineShutdownTimeout time.Duration
	// SkipControllerNameValidation lets one process build the manager more
	// than once (tests restart it); controller names must otherwise be unique.
	SkipControllerNameValidation bool
}

// New builds a manager with the provider's controllers registered: it dials
// opts.LibvirtURI and closes that connection when the manager stops. The
// caller starts the manager.
func New(restConfig *rest.Config, opts Options) (ctrl.Manager, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := virt.Dial(ctx, opts.LibvirtURI)
	if err != nil {
		return nil, fmt.Errorf("connecting to libvirt at %s: %w", opts.LibvirtURI, err)
	}
	mgr, err := NewWithWiring(restConfig, opts, Wiring{Host: host, HostName: hosts.HostName(opts.LibvirtURI)})
	if err == nil {
		err = mgr.Add(closer{host})
	}
	if err != nil {
		_ = host.Close()
		return nil, err
	}
	return mgr, nil
}

// closer closes the libvirt connection when the manager stops, on every
// replica (it does not wait for leader election).
type closer struct{ c *virt.Client }

// Start waits for the manager to stop, then closes the connection.
func (c closer) Start(ctx context.Context) error { <-ctx.Done(); return c.c.Close() }

// NeedLeaderElection is false: every replica holds its own connection.
func (c closer) NeedLeaderElection() bool { return false }

// hostConnections are set's connections as capl_libvirt_host_connected
// reports them.
func hostConnections(set *hosts.Set) []metrics.HostConnection {
	conns := set.Connections()
	out := make([]metrics.HostConnection, 0, len(conns))
	for _, c := range conns {
		hc := metrics.HostConnection{Host: c.Name, URI: c.Ref.URI, Connected: c.Err == nil}
		if c.Ref.Secret != "" {
			hc.Credentials = c.Ref.Namespace + "/" + c.Ref.Secret
		}
		out = append(out, hc)
	}
	return out
}

// NewWithWiring builds a manager on an existing libvirt Host.
func NewWithWiring(restConfig *rest.Config, opts Options, w Wiring) (ctrl.Manager, error) {
	if w.Host == nil {
		return nil, errors.New("no libvirt host")
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	// The diagnostics endpoint's /metrics serves this registry.
	if err := virt.RegisterMetrics(ctrlmetrics.Registry); err != nil {
		return nil, fmt.Errorf("registering the libvirt call metrics: %w", err)
	}
	if err := metrics.Register(ctrlmetrics.Registry); err != nil {
		return nil, fmt.Errorf("registering the provider's metrics: %w", err)
	}
	policy, err := opts.Tenancy()
	if err != nil {
		return nil, err
	}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("invalid --storage-pool-dirs: %w", err)
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
			// Nothing the manager does reads managedFields: the cache
			// keeps every object without them (docs/performance.md).
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Client: client.Options{
			// Bootstrap Secrets are read when needed, not cached: caching
			// would hold every Secret of the management cluster.
			Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}},
		},
		Controller: config.Controller{SkipNameValidation: &w.SkipControllerNameValidation},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    opts.WebhookHost,
			Port:    opts.WebhookPort,
			CertDir: opts.WebhookCertDir,
			TLSOpts: tlsOptions,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}

	imageOpts, err := opts.ImageImportOptions()
	if err != nil {
		return nil, err
	}
	images := imageimport.New(w.Host, imageOpts)
	if err := mgr.Add(images); err != nil {
		return nil, err
	}
	if err := mgr.Add(images.Collector()); err != nil {
		return nil, err
	}
	libvirtHosts := hosts.NewSet(w.Host, opts.LibvirtURI, w.HostName, mgr.GetAPIReader())
	libvirtHosts.Guard(policy)
	// One ledger for both kinds: a namespace's machines and clusters share
	// its totals, and admissions of one namespace are serialised.
	// A host counts for every namespace only when the operator chose it
	// (the manager's own, those --libvirt-uris lists exactly); a host a
	// tenant names counts only for the namespaces whose clusters name it.
	// The operator's hosts are always open, so what is left on them
	// counts from the start; a tenant's host keeps counting, at its last
	// listing, after the last cluster naming it is gone (until a restart).
	shared := func(uri string) bool { return uri == opts.LibvirtURI || slices.Contains(policy.LibvirtURIs, uri) }
	ledger := quota.NewLedger(policy.Namespace, mgr.GetAPIReader(), func() map[string]quota.Lister {
		out := map[string]quota.Lister{}
		for uri, h := range libvirtHosts.Open() {
			out[uri] = h
		}
		return out
	}, quota.WithSharedHosts(shared), quota.WithListingReuse(quota.DefaultListingReuse))
	libvirtHosts.OnPrune(func(uri string, h virt.Host) { ledger.Retire(context.Background(), uri, h) })
	if ledger.Enabled() {
		var listed []hosts.Ref
		for _, uri := range policy.LibvirtURIs {
			if uri != tenancy.Any && uri != tenancy.None && uri != "" {
				listed = append(listed, hosts.Ref{URI: uri})
			}
		}
		if err := libvirtHosts.Keep(context.Background(), listed...); err != nil {
			// Not counted until a cluster names it (and it opens then).
			ctrl.Log.WithName("hosts").Error(err, "Opening the libvirt hosts of --libvirt-uris")
		}
	}
	if err := mgr.Add(metrics.Serve{Registry: ctrlmetrics.Registry, Collectors: []prometheus.Collector{
		metrics.NewMachineStates(mgr.GetCache()),
		metrics.NewHostConnections(func() []metrics.HostConnection { return hostConnections(libvirtHosts) }),
	}}); err != nil {
		return nil, err
	}
	if err := mgr.Add(&hosts.Pruner{Set: libvirtHosts, Clusters: mgr.GetClient(), Interval: opts.HostPruneInterval}); err != nil {
		return nil, err
	}
	if err := (&controllers.LibvirtClusterReconciler{
		Client:           mgr.GetClient(),
		Hosts:            libvirtHosts,
		Recorder:         mgr.GetEventRecorderFor("libvirtcluster-controller"), //nolint:staticcheck // Cluster API's utilities take a record.EventRecorder.
		WatchFilterValue: opts.WatchFilterValue,
		Tenancy:          policy,
		Quota:            ledger,
		Images:           images,
	}).SetupWithManager(context.Background(), mgr, controller.Options{MaxConcurrentReconciles: opts.ClusterConcurrency}); err != nil {
		return nil, fmt.Errorf("setting up the LibvirtCluster controller: %w", err)
	}
	if err := (&controllers.LibvirtMachineReconciler{
		Client:           mgr.GetClient(),
		Hosts:            libvirtHosts,
		Recorder:         mgr.GetEventRecorderFor("libvirtmachine-controller"), //nolint:staticcheck // Cluster API's utilities take a record.EventRecorder.
		WatchFilterValue: opts.WatchFilterValue,
		ShutdownTimeout:  w.MachineShutdownTimeout,
		LoadBalancer:     &loadbalancer.Deregisterer{},
		Tenancy:          policy,
		Quota:            ledger,
		Images:           images,
	}).SetupWithManager(context.Background(), mgr, controller.Options{MaxConcurrentReconciles: opts.MachineConcurrency}); err != nil {
		return nil, fmt.Errorf("setting up the LibvirtMachine controller: %w", err)
	}
	if err := (&controllers.LibvirtMachineTemplateReconciler{Client: mgr.GetClient(), Tenancy: policy}).SetupWithManager(mgr, controller.Options{}); err != nil {
		return nil, fmt.Errorf("setting up the LibvirtMachineTemplate controller: %w", err)
	}

	if err := webhooks.SetupWithManager(mgr, webhooks.Options{Volumes: w.Host, Reader: mgr.GetClient(), LiveReader: mgr.GetAPIReader(), Tenancy: &policy}); err != nil {
		return nil, fmt.Errorf("setting up the webhooks: %w", err)
	}

	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
