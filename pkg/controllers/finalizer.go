package controllers

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// finalizer is a kind's finalizer under its current name and under the
// name earlier releases wrote. Objects made by an earlier release, or
// moved by clusterctl from a management cluster that runs one, carry the
// legacy name: it guards their libvirt objects just the same until the
// next reconcile replaces it.
type finalizer struct {
	name, legacy string
}

var (
	machineFinalizer = finalizer{name: infrav1.MachineFinalizer, legacy: infrav1.LegacyMachineFinalizer}
	clusterFinalizer = finalizer{name: infrav1.ClusterFinalizer, legacy: infrav1.LegacyClusterFinalizer}
)

// heldBy tells whether obj carries the finalizer under either name.
func (f finalizer) heldBy(obj client.Object) bool {
	return controllerutil.ContainsFinalizer(obj, f.name) || controllerutil.ContainsFinalizer(obj, f.legacy)
}

// ensureOn puts the finalizer on obj under its current name, instead of
// the legacy one, and tells whether obj changed (then to be persisted
// before anything is created in libvirt).
func (f finalizer) ensureOn(obj client.Object) bool {
	replaced := controllerutil.RemoveFinalizer(obj, f.legacy)
	added := controllerutil.AddFinalizer(obj, f.name)
	return replaced || added
}

// removeFrom removes the finalizer from obj under both names, and tells
// whether obj changed.
func (f finalizer) removeFrom(obj client.Object) bool {
	a := controllerutil.RemoveFinalizer(obj, f.name)
	b := controllerutil.RemoveFinalizer(obj, f.legacy)
	return a || b
}
