// Package controllers holds the reconcilers of LibvirtCluster and LibvirtMachine.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/cluster-api/util/predicates"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hostevents"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/references"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/segment"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/vmplan"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// LoadBalancerDeregisterer takes a control-plane machine out of the
// cluster's load balancer before its domain is shut down. The LibvirtCluster
// controller provides it; nil means there is no load balancer to leave.
type LoadBalancerDeregisterer interface {
	// DeregisterMachine returns nil once the load balancer sends no new
	// connections to the machine; a services.RequeueError to wait,
	// wrapped in a services.ConditionError for DomainReady.
	DeregisterMachine(ctx context.Context, s *scope.MachineScope) error
}

// LibvirtMachineReconciler turns a LibvirtMachine into a running libvirt domain.
type LibvirtMachineReconciler struct {
	Client client.Client
	// Hosts are the libvirt hosts of the failure domains.
	Hosts    *hosts.Set
	Recorder record.EventRecorder
	// WatchFilterValue limits reconciliation to objects labelled with it.
	WatchFilterValue string
	// ShutdownTimeout bounds the graceful shutdown on delete.
	ShutdownTimeout time.Duration
	// LoadBalancer, when set, deregisters control-plane machines on delete.
	LoadBalancer LoadBalancerDeregisterer
	// Tenancy is what a machine's namespace may name (pools, base images,
	// networks); checked before anything is created.
	Tenancy tenancy.Policy
	// Quota admits new machines within their namespace's totals; nil
	// admits all.
	Quota *quota.Ledger
	// Images imports base images given by URL, outside the reconciles.
	Images *imageimport.Importer

	events *hostevents.Source
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachines;libvirtmachines/status;libvirtmachines/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines;machines/status;clusters;clusters/status,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddresses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile brings one LibvirtMachine closer to its desired state.
func (r *LibvirtMachineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	log := ctrl.LoggerFrom(ctx)
	lm := &infrav1.LibvirtMachine{}
	if err := r.Client.Get(ctx, req.NamespacedName, lm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !lm.DeletionTimestamp.IsZero()
	if deleting && !machineFinalizer.heldBy(lm) {
		return ctrl.Result{}, nil
	}
	if moved, err := releaseForMove(ctx, r.Client, lm, machineFinalizer); moved || err != nil {
		return ctrl.Result{}, err
	}
	// Deletion goes ahead without Machine, Cluster or LibvirtCluster:
	// every name it needs derives from the LibvirtMachine itself.
	machine, err := util.GetOwnerMachine(ctx, r.Client, lm.ObjectMeta)
	if err != nil && !(deleting && apierrors.IsNotFound(err)) {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if machine == nil && !deleting {
		log.V(4).Info("Waiting for the Machine controller to set the owner reference")
		return ctrl.Result{}, nil
	}
	cluster, err := r.cluster(ctx, lm, machine)
	switch {
	case err == nil, deleting && apierrors.IsNotFound(err):
	case apierrors.IsNotFound(err) || errors.Is(err, util.ErrNoCluster):
		log.V(4).Info("Cluster not found", "err", err.Error())
		return ctrl.Result{}, nil
	default:
		return ctrl.Result{}, err
	}
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, lm); err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	libvirtCluster, err := r.libvirtCluster(ctx, cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	place, err := r.placeMachine(ctx, lm, machine, libvirtCluster, deleting)
	if err != nil {
		return ctrl.Result{}, err
	}
	if deleting {
		place = r.findOwnDomain(ctx, lm, place)
	}
	s, err := scope.NewMachineScope(scope.MachineScopeParams{
		Client: r.Client, Cluster: cluster, Machine: machine, LibvirtCluster: libvirtCluster,
		LibvirtMachine: lm, Host: place.host, HostName: place.hostName, FailureDomain: place.failureDomain, Recorder: r.Recorder,
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
		// Deletion waits too: what is on the host is removed once it answers.
		s.MarkFalse(infrav1.DomainReadyCondition, place.problem.reason, "%s", place.problem.message)
		return ctrl.Result{RequeueAfter: recheckHost}, nil
	}
	if deleting {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcileNormal(ctx, s)
}

// reconcileNormal provisions the machine: the plan forward, one
// idempotent step per condition.
func (r *LibvirtMachineReconciler) reconcileNormal(ctx context.Context, s *scope.MachineScope) (ctrl.Result, error) {
	if s.HasFailed() {
		return ctrl.Result{}, nil // terminal: left for a MachineHealthCheck to replace
	}
	if machineFinalizer.ensureOn(s.LibvirtMachine) {
		// Persisted before anything exists in libvirt.
		if err := s.PatchObject(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Recorded early, so that machines created together count each other
	// when the provider spreads them.
	if err := s.RecordFailureDomain(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if !s.ClusterInfrastructureProvisioned() {
		s.MarkWaiting(infrav1.WaitingForClusterInfrastructureReason, "Waiting for the cluster infrastructure to be provisioned")
		return ctrl.Result{}, nil
	}
	if s.BootstrapDataSecretName() == nil {
		s.MarkWaiting(infrav1.WaitingForBootstrapDataReason, "Waiting for the bootstrap provider to set spec.bootstrap.dataSecretName")
		return ctrl.Result{}, nil
	}
	s.ClearWaiting(infrav1.WaitingForClusterInfrastructureReason, infrav1.WaitingForBootstrapDataReason)
	vm, steps := r.plan(s)
	// From here until the domain is defined, the machine's creation is in
	// flight: a move now would leave half of it behind.
	defer func() {
		setMoveBlocked(s.LibvirtMachine, !s.IsProvisioned() && !vm.DomainDefined())
	}()
	return services.Outcome(s, vm.Run(ctx, s, steps))
}

// reconcileDelete removes everything in reverse order of creation (the
// plan backward).
func (r *LibvirtMachineReconciler) reconcileDelete(ctx context.Context, s *scope.MachineScope) (ctrl.Result, error) {
	s.MarkFalse(infrav1.DomainReadyCondition, infrav1.DeletingReason, "Deleting the machine")
	_, steps := r.plan(s)
	if err := steps.Delete(ctx, s); err != nil {
		return services.Outcome(s, err)
	}
	machineFinalizer.removeFrom(s.LibvirtMachine)
	r.Quota.Forget(s.LibvirtMachine)
	return ctrl.Result{}, nil
}

// plan is the machine's VM plan (vmplan, which the HAProxy VM shares)
// with the machine's own steps: the reference check before anything
// exists, the guest's addresses once the domain runs, and the bootstrap
// check and the bootstrap data's removal once provisioned. Reconcile runs
// it forward, delete backward.
func (r *LibvirtMachineReconciler) plan(s *scope.MachineScope) (*vmplan.Plan, services.Plan) {
	vm := s.VM
	opts := domain.Options{ShutdownTimeout: r.ShutdownTimeout}
	if r.LoadBalancer != nil && s.IsControlPlane() {
		// The load balancer stops sending it connections before its
		// domain is shut down.
		opts.Drain = func(ctx context.Context) error { return r.LoadBalancer.DeregisterMachine(ctx, s) }
	}
	p := vmplan.New(vmplan.Spec{
		VM: vm, Host: s.Host, Owner: s,
		Conditions: vmplan.Conditions{
			Address: infrav1.AddressReservedCondition, Disk: infrav1.DiskReadyCondition,
			Seed: infrav1.BootstrapDataReadyCondition, Domain: infrav1.DomainReadyCondition,
		},
		Claims: ipaddress.New(s, s.Host, r.Tenancy), Seed: seed.New(s, s.Host),
		Images: r.Images, Policy: r.Tenancy, MaxDiskBytes: r.Tenancy.Machine.DiskBytes(),
		OtherHosts: otherHosts(r.Hosts), Domain: opts,
	})
	bootstrap := guest.NewBootstrap(vm, s.Host, func(ctx context.Context) (bool, error) { return seed.Emptied(ctx, vm, s.Host) })
	return p, p.Steps(vmplan.Extra{
		// The reference check names the condition of the step a refused
		// reference belongs to.
		Checks:  []services.Step{{Service: references.NewMachine(s, vm, r.Tenancy, r.Quota)}},
		Running: []services.Step{{Service: guest.NewAddresses(vm, s.Host, r.events), Condition: infrav1.AddressAssignedCondition}},
		Provisioned: []services.Step{
			{Service: bootstrap, Condition: infrav1.BootstrapSucceededCondition},
			{Service: seed.NewRemoval(vm, s.Host, bootstrap.Succeeded)},
		},
	})
}

// otherHosts are the libvirt hosts the manager reaches that answer now,
// whose domains a VM's MAC and pool addresses must not collide with.
func otherHosts(set *hosts.Set) segment.Hosts {
	if set == nil {
		return nil
	}
	return func() []virt.NetworkHost {
		var out []virt.NetworkHost
		for _, h := range set.Open() {
			if hosts.Reachable(h) == nil {
				out = append(out, h)
			}
		}
		return out
	}
}

// cluster finds the machine's Cluster from the Machine, or from the
// LibvirtMachine's label when the Machine is gone.
func (r *LibvirtMachineReconciler) cluster(ctx context.Context, lm *infrav1.LibvirtMachine, m *clusterv1.Machine) (*clusterv1.Cluster, error) {
	if m != nil {
		return util.GetClusterFromMetadata(ctx, r.Client, m.ObjectMeta)
	}
	if name := lm.Labels[clusterv1.ClusterNameLabel]; name != "" {
		return util.GetClusterByName(ctx, r.Client, lm.Namespace, name)
	}
	return nil, apierrors.NewNotFound(clusterv1.GroupVersion.WithResource("clusters").GroupResource(), "")
}

// libvirtCluster returns the Cluster's LibvirtCluster; nil when there is
// none (deletion does without it).
func (r *LibvirtMachineReconciler) libvirtCluster(ctx context.Context, c *clusterv1.Cluster) (*infrav1.LibvirtCluster, error) {
	if c == nil || !c.Spec.InfrastructureRef.IsDefined() {
		return nil, nil
	}
	lc := &infrav1.LibvirtCluster{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.InfrastructureRef.Name}, lc)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading LibvirtCluster: %w", err)
	}
	return lc, nil
}

// SetupWithManager registers the reconciler, its watches and the libvirt
// event source with the manager.
func (r *LibvirtMachineReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Hosts == nil || r.Images == nil {
		return errors.New("LibvirtMachineReconciler needs libvirt hosts and an image importer")
	}
	if err := hostevents.IndexMAC(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("indexing LibvirtMachines by MAC: %w", err)
	}
	r.events = hostevents.New(r.Hosts, mgr.GetClient(), r.WatchFilterValue)
	if err := mgr.Add(r.events); err != nil {
		return err
	}
	clusterToMachines, err := util.ClusterToTypedObjectsMapper(mgr.GetClient(), &infrav1.LibvirtMachineList{}, mgr.GetScheme())
	if err != nil {
		return err
	}
	log := mgr.GetLogger().WithName("libvirtmachine")
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.LibvirtMachine{}).
		WithOptions(options).
		WithEventFilter(predicates.ResourceHasFilterLabel(mgr.GetScheme(), log, r.WatchFilterValue)).
		Watches(&clusterv1.Machine{},
			handler.EnqueueRequestsFromMapFunc(util.MachineToInfrastructureMapFunc(infrav1.GroupVersion.WithKind("LibvirtMachine")))).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(clusterToMachines),
			builder.WithPredicates(predicates.ClusterPausedTransitionsOrInfrastructureProvisioned(mgr.GetScheme(), log))).
		// A claim's address arriving wakes its machine.
		Owns(&ipamv1.IPAddressClaim{}).
		WatchesRawSource(r.events.Source()).
		WatchesRawSource(r.Images.Source("LibvirtMachine")).
		Complete(r)
}
