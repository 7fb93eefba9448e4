package controllers

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
)

// releaseForMove lets go of an object that clusterctl move deletes from
// the source management cluster after the target took it over: its libvirt
// objects are the target's now, so the finalizer goes without a delete
// step running. clusterctl removes the finalizers itself; this covers a
// provider that added one back meanwhile, or a move tool that does not.
// It tells whether obj was such an object.
func releaseForMove(ctx context.Context, c client.Client, obj client.Object, finalizer string) (bool, error) {
	// clusterctl sets the annotation with an empty value.
	if _, moved := obj.GetAnnotations()[clusterctlv1.DeleteForMoveAnnotation]; !moved || obj.GetDeletionTimestamp().IsZero() {
		return false, nil
	}
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return true, nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	controllerutil.RemoveFinalizer(obj, finalizer)
	return true, c.Patch(ctx, obj, patch)
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
