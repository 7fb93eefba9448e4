package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/util/index"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// capiControllerName is the user agent and informer name of the in-process
// Cluster API controllers.
const capiControllerName = "capi-testenv"

// capiStarts counts StartCAPI calls in this process.
var capiStarts atomic.Int64

// CAPI is Cluster API's core Cluster, Machine, MachineSet and
// MachineDeployment controllers running in this process against the
// environment, set up as CAPI's own manager (core/main.go) sets them up:
// same cache and client options, indexes, ClusterCache and MachineSet
// preflight checks. No workload cluster is reachable, so Machines never get
// a Node; everything up to the infrastructure contract is real.
type CAPI struct {
	cancel context.CancelFunc
	done   chan error
}

// StartCAPI starts the Cluster API core controllers; stop them with Stop.
func (e *Environment) StartCAPI() (*CAPI, error) {
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// Informer and controller names are process-wide: a second test of the
	// same binary (with its own environment) needs names of its own.
	name := fmt.Sprintf("%s-%d", capiControllerName, capiStarts.Add(1))
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  setup.ManagerCacheOptions(scheme, name, "", 10*time.Minute),
		Client:                 setup.ManagerClientOptions(),
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the Cluster API manager: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fail := func(err error) (*CAPI, error) { cancel(); return nil, err }
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return fail(fmt.Errorf("adding Cluster API indexes: %w", err))
	}
	secretClient, err := setup.CreateSecretCachingClient(mgr)
	if err != nil {
		return fail(err)
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        setup.ClusterCacheCacheOptions(),
		Client:       setup.ClusterCacheClientOptions(capiControllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return fail(fmt.Errorf("creating the ClusterCache: %w", err))
	}
	if err := (&cluster.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConnectionGracePeriod: 50 * time.Second,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 5}); err != nil {
		return fail(fmt.Errorf("setting up the Cluster controller: %w", err))
	}
	if err := (&machine.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConditionsGracePeriod: 5 * time.Minute,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return fail(fmt.Errorf("setting up the Machine controller: %w", err))
	}
	// core/main.go's default for --machineset-preflight-checks.
	preflightChecks := sets.New(clusterv1.MachineSetPreflightCheckAll)
	if err := (&machineset.Reconciler{
		Client:          mgr.GetClient(),
		APIReader:       mgr.GetAPIReader(),
		ClusterCache:    clusterCache,
		PreflightChecks: preflightChecks,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return fail(fmt.Errorf("setting up the MachineSet controller: %w", err))
	}
	// No RuntimeClient: core/main.go passes one for Runtime SDK extensions,
	// which only the InPlaceUpdates feature gate (off) makes it call.
	if err := (&machinedeployment.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return fail(fmt.Errorf("setting up the MachineDeployment controller: %w", err))
	}
	c := &CAPI{cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- mgr.Start(ctx)
		if s, ok := clusterCache.(interface{ Shutdown() }); ok {
			s.Shutdown()
		}
	}()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		_ = c.Stop()
		return nil, errors.New("the Cluster API manager's cache did not sync")
	}
	return c, nil
}

// Stop stops the controllers and waits for them.
func (c *CAPI) Stop() error {
	c.cancel()
	return <-c.done
}
