package devplane

import (
	"context"
	"log"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// foregroundFinalizer is the finalizer the API server adds on a delete
// with foreground propagation; only the garbage collector removes it.
const foregroundFinalizer = metav1.FinalizerDeleteDependents

// foregroundLists are the kinds whose foreground deletion the plane
// completes: Cluster API's machine hierarchy and the provider's.
func foregroundLists() []client.ObjectList {
	return []client.ObjectList{
		&clusterv1.ClusterList{}, &clusterv1.MachineDeploymentList{}, &clusterv1.MachineSetList{},
		&clusterv1.MachineList{}, &infrav1.LibvirtClusterList{}, &infrav1.LibvirtMachineList{},
	}
}

// completeForegroundDeletions does the garbage collector's part of a
// foreground deletion for the kinds of foregroundLists, since the plane
// runs no kube-controller-manager: an object whose only finalizer left is
// foregroundDeletion loses it once no object of those kinds names it as
// owner. Without this a `kubectl delete --cascade=foreground` of a
// Cluster would never finish. Cluster API's controllers delete the
// dependents themselves; the garbage collector's other duties (background
// cascades through owner references) are not emulated.
func completeForegroundDeletions(ctx context.Context, c client.Client) error {
	var objs []client.Object
	for _, l := range foregroundLists() {
		if err := c.List(ctx, l); err != nil {
			return err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return err
		}
		for _, it := range items {
			objs = append(objs, it.(client.Object))
		}
	}
	owners := map[types.UID]bool{}
	for _, o := range objs {
		for _, ref := range o.GetOwnerReferences() {
			owners[ref.UID] = true
		}
	}
	for _, o := range objs {
		if o.GetDeletionTimestamp() == nil || !slices.Equal(o.GetFinalizers(), []string{foregroundFinalizer}) || owners[o.GetUID()] {
			continue
		}
		patch := client.MergeFromWithOptions(o.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
		o.SetFinalizers(nil)
		if err := c.Patch(ctx, o, patch); client.IgnoreNotFound(err) != nil {
			return err
		}
		log.Printf("foreground deletion of %T %s/%s complete: no dependents left", o, o.GetNamespace(), o.GetName())
	}
	return nil
}

// completeForegroundDeletionsEvery runs completeForegroundDeletions every
// interval until ctx ends.
func completeForegroundDeletionsEvery(ctx context.Context, c client.Client, interval time.Duration) {
	for {
		if err := completeForegroundDeletions(ctx, c); err != nil && ctx.Err() == nil {
			log.Printf("completing foreground deletions: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
