//go:build e2e

package e2e

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// extraMachineObjs are a Machine and LibvirtMachine the suite creates
// itself (see createExtraMachine).
type extraMachineObjs struct {
	machine *clusterv1.Machine
	lm      *infrav1.LibvirtMachine
}

// createExtraMachine creates a worker Machine of the cluster under test
// with its LibvirtMachine (the workers' spec) and the extra machines'
// bootstrap Secret. name must start with extraPrefix.
func (s *suite) createExtraMachine(t *testing.T, name string, mutate func(*infrav1.LibvirtMachine)) extraMachineObjs {
	t.Helper()
	if !extraMachine(name) {
		t.Fatalf("extra machine %q must start with %q", name, extraPrefix)
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: s.cut.name}
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels}}
	lm.Spec = *s.cut.machineSpec.DeepCopy()
	if mutate != nil {
		mutate(lm)
	}
	must(t, s.c.Create(s.ctx, lm))
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels}}
	m.Spec.ClusterName = s.cut.name
	m.Spec.Bootstrap.DataSecretName = ptr.To(s.cut.bootstrapSecret)
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: name}
	must(t, s.c.Create(s.ctx, m))
	return extraMachineObjs{machine: m, lm: lm}
}
