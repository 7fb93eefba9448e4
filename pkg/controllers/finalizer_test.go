package controllers

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

func TestFinalizerNames(t *testing.T) {
	const other = "example.com/other"
	for _, tc := range []struct {
		name        string
		has         []string
		held        bool
		ensured     []string
		ensureMoved bool
	}{
		{name: "none", has: nil, held: false, ensured: []string{infrav1.MachineFinalizer}, ensureMoved: true},
		{name: "current", has: []string{other, infrav1.MachineFinalizer}, held: true, ensured: []string{other, infrav1.MachineFinalizer}},
		{name: "legacy", has: []string{infrav1.LegacyMachineFinalizer, other}, held: true, ensured: []string{other, infrav1.MachineFinalizer}, ensureMoved: true},
		{name: "both", has: []string{infrav1.MachineFinalizer, infrav1.LegacyMachineFinalizer}, held: true, ensured: []string{infrav1.MachineFinalizer}, ensureMoved: true},
		{name: "another kind's", has: []string{infrav1.LegacyClusterFinalizer}, held: false,
			ensured: []string{infrav1.LegacyClusterFinalizer, infrav1.MachineFinalizer}, ensureMoved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Finalizers: slices.Clone(tc.has)}}
			if got := machineFinalizer.heldBy(obj); got != tc.held {
				t.Errorf("heldBy = %v, want %v", got, tc.held)
			}
			if changed := machineFinalizer.ensureOn(obj); changed != tc.ensureMoved || !slices.Equal(obj.Finalizers, tc.ensured) {
				t.Errorf("ensureOn: %v (changed %v), want %v (changed %v)", obj.Finalizers, changed, tc.ensured, tc.ensureMoved)
			}
			obj.Finalizers = slices.Clone(tc.has)
			changed := machineFinalizer.removeFrom(obj)
			if slices.Contains(obj.Finalizers, infrav1.MachineFinalizer) || slices.Contains(obj.Finalizers, infrav1.LegacyMachineFinalizer) || changed != tc.held {
				t.Errorf("removeFrom: %v (changed %v)", obj.Finalizers, changed)
			}
		})
	}
}
