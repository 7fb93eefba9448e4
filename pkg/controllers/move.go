package controllers

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
)

// releaseForMove lets go of an object that clusterctl move deletes from
// the source management cluster after the target took it over: its libvirt
// objects are the target's now, so the finalizer goes without a delete
// step running. clusterctl removes the finalizers itself; this covers a
// provider that added one back meanwhile, or a move tool that does not.
// It tells whether obj was such an object.
//
// The marker is anyone's to write, so it counts only while the object's
// Cluster is paused, as clusterctl keeps it throughout a move (it deletes
// the Cluster last). Otherwise the object is deleted as any other, VM and
// all; a tenant who pauses its own Cluster to orphan a VM this way still
// pays for it, since quotas count what is in libvirt (pkg/quota).
func releaseForMove(ctx context.Context, c client.Client, obj client.Object, f finalizer) (bool, error) {
	// clusterctl sets the annotation with an empty value.
	if _, moved := obj.GetAnnotations()[clusterctlv1.DeleteForMoveAnnotation]; !moved || obj.GetDeletionTimestamp().IsZero() {
		return false, nil
	}
	if paused, err := clusterPaused(ctx, c, obj); err != nil || !paused {
		if err == nil {
			ctrl.LoggerFrom(ctx).Info("Ignoring clusterctl's delete-for-move marker: the Cluster is not paused, so this is no move", "marker", clusterctlv1.DeleteForMoveAnnotation)
		}
		return false, err
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	if !f.removeFrom(obj) {
		return true, nil
	}
	return true, c.Patch(ctx, obj, patch)
}

// clusterPaused tells whether obj's Cluster (its cluster-name label, else
// its owner) exists and is paused.
func clusterPaused(ctx context.Context, c client.Client, obj client.Object) (bool, error) {
	name := obj.GetLabels()[clusterv1.ClusterNameLabel]
	if name == "" {
		for _, ref := range obj.GetOwnerReferences() {
			if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
				name = ref.Name
			}
		}
	}
	if name == "" {
		return false, nil
	}
	cluster := &clusterv1.Cluster{}
	err := c.Get(ctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}, cluster)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the Cluster to check a move: %w", err)
	}
	return ptr.Deref(cluster.Spec.Paused, false), nil
}

// setMoveBlocked sets or removes clusterctl's block-move annotation: an
// object whose creation is under way (an image import, the domain not yet
// defined) must not be split between two management clusters.
func setMoveBlocked(obj client.Object, blocked bool) {
	a := obj.GetAnnotations()
	_, has := a[clusterctlv1.BlockMoveAnnotation]
	switch {
	case blocked && !has:
		if a == nil {
			a = map[string]string{}
		}
		a[clusterctlv1.BlockMoveAnnotation] = "true"
		obj.SetAnnotations(a)
	case !blocked && has:
		delete(a, clusterctlv1.BlockMoveAnnotation)
		obj.SetAnnotations(a)
	}
}
