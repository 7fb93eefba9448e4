package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// LibvirtMachineTemplateReconciler reports what the machines of each
// LibvirtMachineTemplate will offer (status.capacity, status.nodeInfo), so
// that the cluster autoscaler can scale a MachineDeployment from zero.
// The figures come from the template's spec alone: a template's spec is
// immutable and its machines get exactly what it asks for.
type LibvirtMachineTemplateReconciler struct {
	Client client.Client
	// Tenancy's host devices say which extended resources (nvidia.com/gpu)
	// a template's host devices give its Nodes.
	Tenancy tenancy.Policy
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachinetemplates/status,verbs=patch

// Reconcile writes the template's status when it differs.
func (r *LibvirtMachineTemplateReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	t := &infrav1.LibvirtMachineTemplate{}
	if err := r.Client.Get(ctx, req.NamespacedName, t); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	want := TemplateStatus(t.Spec.Template.Spec, r.Tenancy)
	if apiequality.Semantic.DeepEqual(t.Status, want) {
		return ctrl.Result{}, nil
	}
	base := t.DeepCopy()
	t.Status = want
	if err := r.Client.Status().Patch(ctx, t, client.MergeFrom(base)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reporting the capacity of LibvirtMachineTemplate %s: %w", req.NamespacedName, err)
	}
	return ctrl.Result{}, nil
}

// TemplateStatus is what a machine of spec offers as a Node: its vCPUs,
// memory and root disk (the kubelet's ephemeral storage; data disks are
// the guest's to use, not the kubelet's), one of an extended resource per
// host device the operator gave one (--host-devices gpu0=.../nvidia.com/gpu;
// the device's plugin in the guest advertises it), on amd64 Linux. The
// API's defaults apply, for templates stored before the webhook wrote
// them.
func TemplateStatus(spec infrav1.LibvirtMachineSpec, policy tenancy.Policy) infrav1.LibvirtMachineTemplateStatus {
	hw := spec.VirtualHardware
	hw.Default(infrav1.DefaultMachineCPUs, infrav1.DefaultMachineMemoryMiB)
	disk := spec.DiskSizeGiB
	if disk == 0 {
		disk = infrav1.DefaultDiskSizeGiB
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(hw.CPUs), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(int64(hw.MemoryMiB)<<20, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(int64(disk)<<30, resource.BinarySI),
	}
	for _, d := range spec.HostDevices {
		dev, err := policy.HostDevice(d.Name)
		if err != nil || dev.Resource == "" {
			continue // refused by the webhook, or no resource of its own
		}
		q := capacity[dev.Resource]
		q.Add(*resource.NewQuantity(1, resource.DecimalSI))
		capacity[dev.Resource] = q
	}
	return infrav1.LibvirtMachineTemplateStatus{
		Capacity: capacity,
		NodeInfo: infrav1.NodeInfo{Architecture: infrav1.ArchitectureAmd64, OperatingSystem: "linux"},
	}
}

// SetupWithManager registers the reconciler.
func (r *LibvirtMachineTemplateReconciler) SetupWithManager(mgr ctrl.Manager, options controller.Options) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.LibvirtMachineTemplate{}).
		WithOptions(options).
		Complete(r)
}
