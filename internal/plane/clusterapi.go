package plane

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/reconcilers/kubeadmconfig"
	bootstrapsetup "sigs.k8s.io/cluster-api/bootstrap/kubeadm/setup"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
	controlplanesetup "sigs.k8s.io/cluster-api/controlplane/kubeadm/setup"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterresourceset"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterresourcesetbinding"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinepool"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
)

// capiControllerName is the user agent and informer name of the in-process
// Cluster API controllers.
const capiControllerName = "capi-plane"

// capiStarts counts the Cluster API managers started in this process.
var capiStarts atomic.Int64

// CAPI is Cluster API's managers running in this process against the
// environment. Each is set up as its main.go sets it up (core/main.go,
// bootstrap/kubeadm/main.go, controlplane/kubeadm/main.go in the module
// go.mod pins): same cache and client options (they differ: the kubeadm
// managers' caches strip objects the core controllers need whole, so the
// three cannot share one manager), indexes, ClusterCache (but the
// bootstrap manager uses the core one's: setupKubeadmBootstrap),
// reconcilers and their options at the binaries' flag defaults. Left out:
// the CRD migrator (the environment installs the CRDs at their storage
// version), leader election, metrics and health endpoints, and Runtime SDK
// (its gate is off by default).
type CAPI struct {
	cancel context.CancelFunc
	done   []chan error
}

// ClusterAPIOptions choose what StartClusterAPI runs.
type ClusterAPIOptions struct {
	// Kubeadm adds the kubeadm bootstrap (KubeadmConfig) and kubeadm
	// control-plane (KubeadmControlPlane) managers to the core one; their
	// CRDs must be installed (WithKubeadmCRDs or WithClusterAPIWebhooks).
	Kubeadm bool
	// WebhookPort, when not 0, makes the core manager serve the webhooks
	// of all three managers (install their configurations with
	// WithClusterAPIWebhooks, route them with RouteWebhooks) on
	// WebhookHost:WebhookPort (empty host: 127.0.0.1, where the
	// environment's API server calls; never every interface, which guests
	// would reach through their gateway) with the certificate in
	// WebhookCertDir. One
	// server saves two ports and certificates; the one kubeadm webhook that
	// reads (KubeadmControlPlane scale) reads through the core manager's
	// client as well as through its own.
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string
}

// StartCAPI starts Cluster API's core manager (see StartClusterAPI)
// without webhooks; stop it with Stop.
func (e *Environment) StartCAPI() (*CAPI, error) {
	return e.StartClusterAPI(ClusterAPIOptions{})
}

// StartClusterAPI starts Cluster API's core manager: the Cluster, Machine,
// MachineSet, MachineDeployment, MachinePool, ClusterClass and topology,
// ClusterResourceSet(Binding) and MachineHealthCheck controllers, with the
// feature gates of a clusterctl installation with CLUSTER_TOPOLOGY=true
// (ClusterTopology on, MachinePool on by default; ClusterResourceSet is no
// longer gated); with o.Kubeadm the kubeadm bootstrap and control-plane
// managers too. No workload cluster is reachable unless a test makes one,
// so Machines never get a Node; everything up to that is real. It returns
// once every manager's cache is in sync (and the webhook server answers);
// stop them with Stop.
func (e *Environment) StartClusterAPI(o ClusterAPIOptions) (*CAPI, error) {
	if err := enableClusterTopology(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &CAPI{cancel: cancel}
	// A manager that fails to start says why in its Start's error.
	fail := func(err error) (*CAPI, error) { return nil, errors.Join(err, c.Stop()) }
	core, err := e.newCAPIManager(setup.ManagerCacheOptions, setup.ManagerClientOptions(), o)
	if err != nil {
		return fail(err)
	}
	coreClusterCache, err := setupCore(ctx, core, o.WebhookPort != 0)
	if err != nil {
		return fail(err)
	}
	mgrs := []ctrl.Manager{core}
	if o.Kubeadm {
		bootstrap, err := e.newCAPIManager(bootstrapsetup.ManagerCacheOptions, bootstrapsetup.ManagerClientOptions(), ClusterAPIOptions{})
		if err != nil {
			return fail(err)
		}
		if err := setupKubeadmBootstrap(ctx, bootstrap, coreClusterCache); err != nil {
			return fail(err)
		}
		controlPlane, err := e.newCAPIManager(controlplanesetup.ManagerCacheOptions, controlplanesetup.ManagerClientOptions(), ClusterAPIOptions{})
		if err != nil {
			return fail(err)
		}
		if err := setupKubeadmControlPlane(ctx, controlPlane); err != nil {
			return fail(err)
		}
		mgrs = append(mgrs, bootstrap, controlPlane)
	}
	for _, mgr := range mgrs {
		done := make(chan error, 1)
		c.done = append(c.done, done)
		go func() { done <- mgr.Start(ctx) }()
	}
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	for _, mgr := range mgrs {
		if !mgr.GetCache().WaitForCacheSync(syncCtx) {
			return fail(errors.New("a Cluster API manager's cache did not sync"))
		}
	}
	if o.WebhookPort != 0 {
		started := core.GetWebhookServer().StartedChecker()
		for started(nil) != nil {
			select {
			case <-syncCtx.Done():
				return fail(errors.New("Cluster API's webhook server did not start"))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return c, nil
}

// Stop stops the managers and waits for them.
func (c *CAPI) Stop() error {
	c.cancel()
	var errs []error
	for _, done := range c.done {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newCAPIManager builds a manager as Cluster API's main.go's do, with the
// cache and client options of the provider's setup package.
func (e *Environment) newCAPIManager(cacheOptions func(*runtime.Scheme, string, string, time.Duration) ctrlcache.Options, clientOptions client.Options, o ClusterAPIOptions) (ctrl.Manager, error) {
	scheme, err := fullScheme()
	if err != nil {
		return nil, err
	}
	// Informer and controller names are process-wide: a second manager
	// (or a second test of the same binary) needs names of its own.
	name := fmt.Sprintf("%s-%d", capiControllerName, capiStarts.Add(1))
	opts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOptions(scheme, name, "", 10*time.Minute),
		Client:                 clientOptions,
		Controller: config.Controller{
			SkipNameValidation: ptr.To(true),
			UsePriorityQueue:   ptr.To(feature.Gates.Enabled(feature.PriorityQueue)),
			CacheSyncTimeout:   5 * time.Minute,
		},
	}
	if o.WebhookPort != 0 {
		host := o.WebhookHost
		if host == "" {
			host = loopbackHost
		}
		opts.WebhookServer = webhook.NewServer(webhook.Options{Host: host, Port: o.WebhookPort, CertDir: o.WebhookCertDir})
	}
	mgr, err := ctrl.NewManager(e.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("creating a Cluster API manager: %w", err)
	}
	return mgr, nil
}

// newClusterCache is the ClusterCache every Cluster API manager makes, with
// its provider's cache and client options.
func newClusterCache(ctx context.Context, mgr ctrl.Manager, cacheOptions clustercache.CacheOptions, clientOptions clustercache.ClientOptions) (clustercache.ClusterCache, error) {
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return nil, fmt.Errorf("adding Cluster API indexes: %w", err)
	}
	secretClient, err := setup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        cacheOptions,
		Client:       clientOptions,
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, fmt.Errorf("creating the ClusterCache: %w", err)
	}
	return cc, nil
}

// reconciler is a Cluster API reconciler's SetupWithManager.
type reconciler interface {
	SetupWithManager(context.Context, ctrl.Manager, controller.Options) error
}

func setupReconcilers(ctx context.Context, mgr ctrl.Manager, rs map[string]reconciler) error {
	for name, r := range rs {
		if err := r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
			return fmt.Errorf("setting up Cluster API's %s controller: %w", name, err)
		}
	}
	return nil
}

// setupCore wires the core manager's reconcilers as core/main.go's
// setupReconcilers does, and its webhooks (plus the kubeadm providers')
// when webhooks is set. It returns the manager's ClusterCache.
func setupCore(ctx context.Context, mgr ctrl.Manager, webhooks bool) (clustercache.ClusterCache, error) {
	clusterCache, err := newClusterCache(ctx, mgr, setup.ClusterCacheCacheOptions(), setup.ClusterCacheClientOptions(capiControllerName, 20, 30))
	if err != nil {
		return nil, err
	}
	// The ClusterResourceSet controller watches every Secret a set may
	// name, as metadata only, through a cache of its own (core/main.go).
	partialSecretCache, err := ctrlcache.New(mgr.GetConfig(), ctrlcache.Options{
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
		HTTPClient: mgr.GetHTTPClient(),
		SyncPeriod: ptr.To(10 * time.Minute),
		DefaultTransform: func(in any) (any, error) {
			obj, ok := in.(*metav1.PartialObjectMetadata)
			if !ok || obj.GetObjectKind().GroupVersionKind() != corev1.SchemeGroupVersion.WithKind("Secret") {
				return nil, fmt.Errorf("the metadata-only Secret cache got %T", in)
			}
			return ctrlcache.TransformStripManagedFields()(obj)
		},
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(partialSecretCache); err != nil {
		return nil, err
	}
	if err := ClusterAPITopologyReconcilers(ctx, mgr, clusterCache); err != nil {
		return nil, err
	}
	if err := setupReconcilers(ctx, mgr, map[string]reconciler{
		"Cluster": &cluster.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: clusterCache,
			RemoteConnectionGracePeriod: 50 * time.Second,
		},
		"Machine": &machine.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: clusterCache,
			RemoteConditionsGracePeriod: 5 * time.Minute,
		},
		// core/main.go's default for --machineset-preflight-checks.
		"MachineSet": &machineset.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: clusterCache,
			PreflightChecks: sets.New(clusterv1.MachineSetPreflightCheckAll),
		},
		// No RuntimeClient: core/main.go passes one for Runtime SDK
		// extensions, which only the InPlaceUpdates gate (off) calls.
		"MachineDeployment": &machinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()},
		"MachinePool": &machinepool.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: clusterCache,
		},
		"ClusterResourceSetBinding": &clusterresourcesetbinding.Reconciler{Client: mgr.GetClient()},
		"MachineHealthCheck":        &machinehealthcheck.Reconciler{Client: mgr.GetClient(), ClusterCache: clusterCache},
	}); err != nil {
		return nil, err
	}
	if err := (&clusterresourceset.Reconciler{Client: mgr.GetClient(), ClusterCache: clusterCache}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}, partialSecretCache); err != nil {
		return nil, fmt.Errorf("setting up Cluster API's ClusterResourceSet controller: %w", err)
	}
	if !webhooks {
		return clusterCache, nil
	}
	return clusterCache, ClusterAPIWebhooks(ctx, mgr)
}

// setupKubeadmBootstrap wires bootstrap/kubeadm/main.go's KubeadmConfig
// reconciler: it renders a Machine's KubeadmConfig into cloud-init or
// Ignition, with a join token of the default TTL, into the Secret the
// Machine's spec.bootstrap.dataSecretName names.
//
// It uses the core manager's ClusterCache, where bootstrap/kubeadm/main.go
// makes its own. Every ClusterCache holds a connection to each workload
// cluster and probes its API server every 10 s (its health check is not
// configurable); during a control-plane rollout under TCG those probes
// were most of what the plane asked of the old API server (docs/tcg.md,
// "What the plane asks of a joining control plane"). The reconciler only
// reads and writes bootstrap-token Secrets through it, which the core
// cache does not cache either, and listens for its connect events, so
// sharing changes nothing it sees. KubeadmControlPlane keeps its own: it
// caches the static pods the core cache must read uncached (drain).
func setupKubeadmBootstrap(ctx context.Context, mgr ctrl.Manager, clusterCache clustercache.ClusterCache) error {
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return fmt.Errorf("adding Cluster API indexes: %w", err)
	}
	secretClient, err := bootstrapsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return err
	}
	return setupReconcilers(ctx, mgr, map[string]reconciler{"KubeadmConfig": &kubeadmconfig.Reconciler{
		Client:              mgr.GetClient(),
		SecretCachingClient: secretClient,
		APIReader:           mgr.GetAPIReader(),
		ClusterCache:        clusterCache,
		TokenTTL:            kubeadmconfig.DefaultTokenTTL,
	}})
}

// kcpEtcdTimeout bounds KubeadmControlPlane's dial of and calls to a
// workload cluster's etcd, which go through the API server and kubelet as
// a port-forward (the flags' defaults are 10 s and 15 s). A TCG control
// plane answered later than that while it was busy; each timeout makes
// the etcd health unknown, and KubeadmControlPlane then refuses to scale
// up, so a rollout waited for a quiet moment that a busy guest never had.
const kcpEtcdTimeout = time.Minute

// setupKubeadmControlPlane wires controlplane/kubeadm/main.go's
// KubeadmControlPlane reconciler with its flag defaults (remote conditions
// grace 5 min) but longer etcd timeouts (kcpEtcdTimeout).
func setupKubeadmControlPlane(ctx context.Context, mgr ctrl.Manager) error {
	clusterCache, err := newClusterCache(ctx, mgr, controlplanesetup.ClusterCacheCacheOptions(),
		controlplanesetup.ClusterCacheClientOptions(capiControllerName, 20, 30))
	if err != nil {
		return err
	}
	secretClient, err := controlplanesetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return err
	}
	etcdLogger, err := logutil.CreateDefaultZapLogger(zapcore.InfoLevel)
	if err != nil {
		return err
	}
	return setupReconcilers(ctx, mgr, map[string]reconciler{"KubeadmControlPlane": &kubeadmcontrolplane.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		SecretCachingClient:         secretClient,
		ClusterCache:                clusterCache,
		EtcdDialTimeout:             kcpEtcdTimeout,
		EtcdCallTimeout:             kcpEtcdTimeout,
		EtcdLogger:                  etcdLogger,
		RemoteConditionsGracePeriod: 5 * time.Minute,
	}})
}
