package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/cluster-api/util/predicates"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hostevents"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/loadbalancer"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/network"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/pool"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/references"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// waitForMachines is how often a deleting cluster looks whether its
// LibvirtMachines are gone (their deletion also triggers a reconcile).
const waitForMachines = 10 * time.Second

// LibvirtClusterReconciler gives a Cluster its libvirt network and its
// control-plane endpoint.
type LibvirtClusterReconciler struct {
	Client client.Client
	// Hosts are the libvirt hosts of the failure domains; the cluster's
	// network and HAProxy VM live on its load balancer's.
	Hosts    *hosts.Set
	Recorder record.EventRecorder
	// WatchFilterValue limits reconciliation to objects labelled with it.
	WatchFilterValue string
	// Tenancy is what a cluster's namespace may name (pool, network,
	// HAProxy image); checked before anything is created.
	Tenancy tenancy.Policy
	// Quota admits new clusters within their namespace's totals; nil
	// admits all.
	Quota *quota.Ledger
	// Images imports the HAProxy VM's image when given by URL.
	Images *imageimport.Importer
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtclusters;libvirtclusters/status;libvirtclusters/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtclustertemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;clusters/status;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddresses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile brings one LibvirtCluster closer to its desired state.
func (r *LibvirtClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	log := ctrl.LoggerFrom(ctx)
	lc := &infrav1.LibvirtCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, lc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if annotations.IsExternallyManaged(lc) {
		log.V(4).Info("LibvirtCluster is externally managed, skipping")
		return ctrl.Result{}, nil
	}
	deleting := !lc.DeletionTimestamp.IsZero()
	if deleting && !clusterFinalizer.heldBy(lc) {
		return ctrl.Result{}, nil
	}
	if moved, err := releaseForMove(ctx, r.Client, lc, clusterFinalizer); moved || err != nil {
		return ctrl.Result{}, err
	}
	// Deletion goes ahead without the Cluster: every name it needs derives
	// from the LibvirtCluster itself.
	cluster, err := util.GetOwnerCluster(ctx, r.Client, lc.ObjectMeta)
	switch {
	case err == nil, deleting && apierrors.IsNotFound(err):
	default:
		return ctrl.Result{}, err
	}
	if cluster == nil && !deleting {
		log.V(4).Info("Waiting for the Cluster controller to set the owner reference")
		return ctrl.Result{}, nil
	}
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, lc); err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	place := placeCluster(ctx, r.Hosts, r.Tenancy, lc)
	s, err := scope.NewClusterScope(scope.ClusterScopeParams{
		Client: r.Client, Cluster: cluster, LibvirtCluster: lc, Host: place.host, HostName: place.hostName, Recorder: r.Recorder,
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		if err := s.Close(ctx); err != nil && reterr == nil {
			reterr = err
		}
	}()
	if place.problem != nil {
		// Deletion waits too: the network and VM are removed once it answers.
		s.SetFailureDomains()
		for _, c := range []string{infrav1.NetworkReadyCondition, infrav1.LoadBalancerReadyCondition} {
			s.MarkFalse(c, place.problem.reason, "%s", place.problem.message)
		}
		return ctrl.Result{RequeueAfter: recheckHost}, nil
	}
	if deleting {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcileNormal(ctx, s)
}

// reconcileNormal provisions the cluster infrastructure: the plan
// forward, one idempotent step per condition.
func (r *LibvirtClusterReconciler) reconcileNormal(ctx context.Context, s *scope.ClusterScope) (ctrl.Result, error) {
	if clusterFinalizer.ensureOn(s.LibvirtCluster) {
		// Persisted before anything exists in libvirt.
		if err := s.PatchObject(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}
	s.SetFailureDomains()
	// Until the cluster is provisioned (network made, HAProxy VM defined and
	// started) its creation is in flight: no move.
	defer func() {
		setMoveBlocked(s.LibvirtCluster, !s.LibvirtCluster.Status.Initialization.IsProvisioned())
	}()
	return r.plan(s).Reconcile(ctx, s, false)
}

// plan is the cluster's services in the order they create things, each
// with the condition its outcome sets; reconcile runs it forward, delete
// backward. The reference check names the condition of each refusal; the
// load balancer reports LoadBalancerReady through its own plan.
func (r *LibvirtClusterReconciler) plan(s *scope.ClusterScope) services.Plan {
	return services.Plan{
		{Service: references.NewCluster(s, r.Tenancy, r.Quota)},
		{Service: pool.New(s, s.Host), Condition: infrav1.StoragePoolReadyCondition},
		{Service: network.New(s, s.Host, netalloc.CandidatesWithin(r.Tenancy.NetworkCIDRs)), Condition: infrav1.NetworkReadyCondition},
		{Service: loadbalancer.New(s, r.Images, r.Tenancy).WithMaxDiskBytes(r.Tenancy.Machine.DiskBytes()).WithOtherHosts(otherHosts(r.Hosts))},
	}
}

// reconcileDelete waits for the cluster's machines to be gone, then
// removes the load balancer and the network the provider created (the
// plan backward).
func (r *LibvirtClusterReconciler) reconcileDelete(ctx context.Context, s *scope.ClusterScope) (ctrl.Result, error) {
	left, err := r.remainingMachines(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(left) > 0 {
		msg := fmt.Sprintf("Waiting for LibvirtMachines %s to be deleted", strings.Join(left, ", "))
		for _, c := range []string{infrav1.NetworkReadyCondition, infrav1.LoadBalancerReadyCondition} {
			s.MarkFalse(c, infrav1.WaitingForMachinesDeletionReason, "%s", msg)
		}
		return ctrl.Result{RequeueAfter: waitForMachines}, nil
	}
	s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.DeletingReason, "Deleting the load balancer")
	s.MarkFalse(infrav1.NetworkReadyCondition, infrav1.DeletingReason, "Deleting the network")
	if err := r.plan(s).Delete(ctx, s); err != nil {
		return services.Outcome(s, err)
	}
	clusterFinalizer.removeFrom(s.LibvirtCluster)
	r.Quota.Forget(s.LibvirtCluster)
	return ctrl.Result{}, nil
}

// remainingMachines names the LibvirtMachines of the cluster that exist.
func (r *LibvirtClusterReconciler) remainingMachines(ctx context.Context, s *scope.ClusterScope) ([]string, error) {
	if s.ClusterName() == "" {
		return nil, nil
	}
	list := &infrav1.LibvirtMachineList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.Namespace()),
		client.MatchingLabels{clusterv1.ClusterNameLabel: s.ClusterName()}); err != nil {
		return nil, fmt.Errorf("listing the cluster's LibvirtMachines: %w", err)
	}
	names := make([]string, 0, len(list.Items))
	for _, m := range list.Items {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return names, nil
}

// SetupWithManager registers the reconciler, its watches and the libvirt
// event source of the HAProxy VMs with the manager.
func (r *LibvirtClusterReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Hosts == nil || r.Images == nil {
		return errors.New("LibvirtClusterReconciler needs libvirt hosts and an image importer")
	}
	// The HAProxy VMs' domains name their LibvirtCluster as owner: the
	// guest agent connecting is when the configuration can be written, and
	// a VM that stopped is started again.
	events := hostevents.NewForwarder(r.Hosts, mgr.GetClient(), "LibvirtCluster", r.WatchFilterValue,
		func() *infrav1.LibvirtCluster { return &infrav1.LibvirtCluster{} },
		func() client.ObjectList { return &infrav1.LibvirtClusterList{} })
	if err := mgr.Add(events); err != nil {
		return err
	}
	log := mgr.GetLogger().WithName("libvirtcluster")
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.LibvirtCluster{}).
		WithOptions(options).
		WithEventFilter(predicates.ResourceHasFilterLabel(mgr.GetScheme(), log, r.WatchFilterValue)).
		WithEventFilter(predicates.ResourceIsNotExternallyManaged(mgr.GetScheme(), log)).
		Watches(&clusterv1.Cluster{},
			handler.EnqueueRequestsFromMapFunc(util.ClusterToInfrastructureMapFunc(ctx, infrav1.GroupVersion.WithKind("LibvirtCluster"), mgr.GetClient(), &infrav1.LibvirtCluster{})),
			builder.WithPredicates(predicates.ClusterPausedTransitions(mgr.GetScheme(), log))).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineToLibvirtCluster)).
		Watches(&infrav1.LibvirtMachine{}, handler.EnqueueRequestsFromMapFunc(r.libvirtMachineToLibvirtCluster)).
		// The HAProxy VM's address from a pool arriving wakes the cluster.
		Owns(&ipamv1.IPAddressClaim{}).
		WatchesRawSource(events.Source()).
		WatchesRawSource(r.Images.Source("LibvirtCluster")).
		Complete(r)
}

// machineToLibvirtCluster maps a control-plane Machine to its cluster's
// LibvirtCluster: its address and deletion change the backends.
func (r *LibvirtClusterReconciler) machineToLibvirtCluster(ctx context.Context, o client.Object) []reconcile.Request {
	if !scope.IsControlPlane(nil, o) {
		return nil
	}
	return r.clusterToLibvirtCluster(ctx, o.GetNamespace(), o.GetLabels()[clusterv1.ClusterNameLabel])
}

// libvirtMachineToLibvirtCluster maps a LibvirtMachine to its cluster's
// LibvirtCluster when it matters there: a control-plane machine's address
// or deletion changes the backends, and any machine's deletion may be the
// last one a deleting cluster waits for.
func (r *LibvirtClusterReconciler) libvirtMachineToLibvirtCluster(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetDeletionTimestamp().IsZero() && !r.isControlPlane(ctx, o) {
		return nil
	}
	return r.clusterToLibvirtCluster(ctx, o.GetNamespace(), o.GetLabels()[clusterv1.ClusterNameLabel])
}

// isControlPlane tells whether a LibvirtMachine is a control-plane
// machine (scope.IsControlPlane), reading its owning Machine when its own
// labels do not say so yet.
func (r *LibvirtClusterReconciler) isControlPlane(ctx context.Context, o client.Object) bool {
	if scope.IsControlPlane(nil, o) {
		return true
	}
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "Machine" {
		return false
	}
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}, m); err != nil {
		return false
	}
	return scope.IsControlPlane(m, o)
}

// clusterToLibvirtCluster is the LibvirtCluster the named Cluster refers to.
func (r *LibvirtClusterReconciler) clusterToLibvirtCluster(ctx context.Context, namespace, name string) []reconcile.Request {
	if name == "" {
		return nil
	}
	c := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, c); err != nil {
		return nil
	}
	ref := c.Spec.InfrastructureRef
	if ref.Kind != "LibvirtCluster" || ref.APIGroup != infrav1.GroupVersion.Group {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: ref.Name}}}
}
