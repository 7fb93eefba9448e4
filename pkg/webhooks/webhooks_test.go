package webhooks

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation/field"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

var testImage = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "debian.qcow2"}}

// TestDefaultsIdempotent checks that defaulting twice changes nothing: the
// topology controller's dry-runs default objects that are already defaulted.
func TestDefaultsIdempotent(t *testing.T) {
	clusters := []infrav1.LibvirtClusterSpec{
		{},
		{LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone}, ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "10.0.0.1"}},
		{LoadBalancer: infrav1.LoadBalancer{VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeQEMU}}},
		{StoragePool: infrav1.StoragePool{Name: "fast"}},
	}
	for _, spec := range clusters {
		once := spec.DeepCopy()
		DefaultClusterSpec(once)
		twice := once.DeepCopy()
		DefaultClusterSpec(twice)
		if d := cmp.Diff(once, twice); d != "" {
			t.Errorf("defaulting %+v twice differs (-once +twice):\n%s", spec, d)
		}
	}
	machines := []infrav1.LibvirtMachineSpec{
		{Image: testImage},
		{Image: testImage, VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeQEMU}},
	}
	for _, spec := range machines {
		once := spec.DeepCopy()
		DefaultMachineSpec(once)
		twice := once.DeepCopy()
		DefaultMachineSpec(twice)
		if d := cmp.Diff(once, twice); d != "" {
			t.Errorf("defaulting %+v twice differs (-once +twice):\n%s", spec, d)
		}
	}
}

// TestUpdateOfUndefaultedObjects checks that objects stored before the
// webhooks existed (no defaults in them) can still be updated: the
// defaulting of the update alone must not count as a change of an
// immutable field.
func TestUpdateOfUndefaultedObjects(t *testing.T) {
	ctx := context.Background()
	defaulted := func(s infrav1.LibvirtClusterSpec) infrav1.LibvirtClusterSpec { DefaultClusterSpec(&s); return s }
	oldCluster := &infrav1.LibvirtCluster{Spec: infrav1.LibvirtClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "10.0.0.2", Port: 6443}}}
	newCluster := &infrav1.LibvirtCluster{Spec: defaulted(oldCluster.Spec)}
	if _, err := (&LibvirtCluster{}).ValidateUpdate(ctx, oldCluster, newCluster); err != nil {
		t.Errorf("LibvirtCluster: %v", err)
	}

	oldCT := &infrav1.LibvirtClusterTemplate{}
	newCT := &infrav1.LibvirtClusterTemplate{}
	newCT.Spec.Template.Spec = defaulted(oldCT.Spec.Template.Spec)
	if _, err := (&LibvirtClusterTemplate{}).ValidateUpdate(ctx, oldCT, newCT); err != nil {
		t.Errorf("LibvirtClusterTemplate: %v", err)
	}

	oldM := &infrav1.LibvirtMachine{Spec: infrav1.LibvirtMachineSpec{Image: testImage}}
	newM := oldM.DeepCopy()
	DefaultMachineSpec(&newM.Spec)
	if _, err := (&LibvirtMachine{}).ValidateUpdate(ctx, oldM, newM); err != nil {
		t.Errorf("LibvirtMachine: %v", err)
	}

	oldMT := &infrav1.LibvirtMachineTemplate{}
	oldMT.Spec.Template.Spec.Image = testImage
	newMT := oldMT.DeepCopy()
	DefaultMachineSpec(&newMT.Spec.Template.Spec)
	if _, err := (&LibvirtMachineTemplate{}).ValidateUpdate(ctx, oldMT, newMT); err != nil {
		t.Errorf("LibvirtMachineTemplate: %v", err)
	}
	// Without an admission request in the context nothing is a dry-run.
	newMT.Spec.Template.Spec.CPUs = 16
	if _, err := (&LibvirtMachineTemplate{}).ValidateUpdate(ctx, oldMT, newMT); err == nil {
		t.Error("LibvirtMachineTemplate: a changed spec was accepted")
	}
}

func TestHardwareWarnings(t *testing.T) {
	spec := infrav1.LibvirtMachineSpec{Image: testImage, VirtualHardware: infrav1.VirtualHardware{TCGTranslationCacheMiB: 128}}
	DefaultMachineSpec(&spec)
	w, err := (&LibvirtMachine{}).ValidateCreate(context.Background(), &infrav1.LibvirtMachine{Spec: spec})
	if err != nil || len(w) != 1 {
		t.Fatalf("kvm machine with a TCG cache: warnings %q, error %v; want one warning", w, err)
	}
	spec.DomainType, spec.CPUMode = infrav1.DomainTypeQEMU, infrav1.CPUModeMaximum
	if w, _ := (&LibvirtMachine{}).ValidateCreate(context.Background(), &infrav1.LibvirtMachine{Spec: spec}); len(w) != 0 {
		t.Fatalf("qemu machine with a TCG cache: warnings %q", w)
	}
}

// TestHAProxyOnBridgeEndpoint checks the endpoint the HAProxy VM holds as
// a static address on a host bridge: an IP address, required of a
// cluster, left to the Cluster of a template.
func TestHAProxyOnBridgeEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		host     string
		template bool
		wantErr  bool
	}{
		{name: "an IPv4 address", host: "10.231.0.240"},
		{name: "an IPv6 address", host: "fd00::240"},
		{name: "no endpoint", wantErr: true},
		{name: "a DNS name", host: "api.lan", wantErr: true},
		{name: "a template names none", template: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &infrav1.LibvirtClusterSpec{Network: infrav1.ClusterNetwork{Bridge: "br0"}, ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: tc.host}}
			DefaultClusterSpec(spec)
			errs, _ := validateClusterSpec(spec, field.NewPath("spec"), tc.template)
			if got := len(errs) > 0; got != tc.wantErr {
				t.Fatalf("errors %v; want some: %v", errs, tc.wantErr)
			}
			if tc.wantErr && errs[0].Field != "spec.controlPlaneEndpoint.host" {
				t.Errorf("error on %s; want spec.controlPlaneEndpoint.host", errs[0].Field)
			}
		})
	}
}
