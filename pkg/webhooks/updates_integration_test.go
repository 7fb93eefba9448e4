package webhooks_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// TestAllowedUpdates checks what may change: what the provider sets once,
// template metadata, and what the controllers cope with.
func TestAllowedUpdates(t *testing.T) {
	requireEnv(t)
	cases := []struct {
		name   string
		obj    func() client.Object
		update func(client.Object)
	}{
		{"HAProxy endpoint host set by the provider", cluster(func(*infrav1.LibvirtClusterSpec) {}),
			onCluster(func(s *infrav1.LibvirtClusterSpec) { s.ControlPlaneEndpoint.Host = "192.168.150.2" })},
		{"storage pool and failure domains", cluster(func(*infrav1.LibvirtClusterSpec) {}),
			onCluster(func(s *infrav1.LibvirtClusterSpec) {
				s.StoragePool = infrav1.StoragePool{Name: "other"}
				s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "host-a", ControlPlane: ptr.To(true)}}
			})},
		{"providerID set once", machine(func(*infrav1.LibvirtMachineSpec) {}),
			onMachine(func(s *infrav1.LibvirtMachineSpec) { s.ProviderID = "libvirt:///0e7c2c1e-8a9e-4d56-9d3c-5e3f5a0b7c11" })},
		{"machine labels", machine(func(*infrav1.LibvirtMachineSpec) {}),
			func(o client.Object) { o.SetLabels(map[string]string{"team": "a"}) }},
		{"template metadata", machineTemplate(func(*infrav1.LibvirtMachineSpec) {}),
			func(o client.Object) {
				o.(*infrav1.LibvirtMachineTemplate).Spec.Template.ObjectMeta.Labels = map[string]string{"team": "a"}
			}},
		{"cluster template unchanged spec", clusterTemplate(func(*infrav1.LibvirtClusterSpec) {}),
			func(o client.Object) { o.SetAnnotations(map[string]string{"note": "x"}) }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.obj()
			obj.SetNamespace(namespace)
			obj.SetName(name("allowed", i))
			if err := create(t, obj); err != nil {
				t.Fatal(err)
			}
			tc.update(obj)
			if err := c.Update(ctx(t), obj); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPlacementIsFixed: once the provider recorded where an object's
// volumes and network are, the API server refuses an edit or removal of
// that record (a tenant could otherwise orphan a root disk and a seed by
// repointing it before a delete), while other annotations still change.
func TestPlacementIsFixed(t *testing.T) {
	requireEnv(t)
	obj := machine(func(*infrav1.LibvirtMachineSpec) {})().(*infrav1.LibvirtMachine)
	obj.Namespace, obj.Name = namespace, name("placement", 0)
	obj.Annotations = map[string]string{scope.PoolAnnotation: "capi-libvirt", scope.NetworkAnnotation: "network:capl-" + namespace + ".c"}
	if err := create(t, obj); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		edit   func(a map[string]string)
		refuse bool
	}{
		{"another annotation", func(a map[string]string) { a["note"] = "x" }, false},
		{"the pool repointed", func(a map[string]string) { a[scope.PoolAnnotation] = "images" }, true},
		{"the network removed", func(a map[string]string) { delete(a, scope.NetworkAnnotation) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := &infrav1.LibvirtMachine{}
			if err := c.Get(ctx(t), client.ObjectKeyFromObject(obj), cur); err != nil {
				t.Fatal(err)
			}
			tc.edit(cur.Annotations)
			err := c.Update(ctx(t), cur)
			if tc.refuse && (err == nil || !strings.Contains(err.Error(), "cannot change")) {
				t.Fatalf("update: %v, want a refusal", err)
			}
			if !tc.refuse && err != nil {
				t.Fatal(err)
			}
		})
	}
	// clusterctl move marks each source object before deleting it with
	// this patch (cmd/clusterctl/client/cluster/mover.go), which replaces
	// every annotation, the placement included: it must pass, or the move
	// fails half way with the objects on both sides.
	cur := obj.DeepCopy()
	if err := c.Patch(ctx(t), cur, testenv.DeleteForMovePatch()); err != nil {
		t.Fatalf("clusterctl move's delete-for-move patch: %v", err)
	}
	if _, ok := cur.Annotations[clusterctlv1.DeleteForMoveAnnotation]; !ok || len(cur.Annotations) != 1 {
		t.Errorf("annotations after clusterctl's patch: %v", cur.Annotations)
	}
}

// TestFailureDomainHostFixed: a failure domain's uri cannot change, nor
// the failure domain go, while a LibvirtMachine is placed there; failure
// domains nobody uses change freely. On the code before this test every
// one of these updates passed (deletion then looked on the wrong host).
func TestFailureDomainHostFixed(t *testing.T) {
	requireEnv(t)
	const a, b = "qemu+tcp://192.0.2.10/system", "qemu+tcp://192.0.2.11/system"
	lc := cluster(func(s *infrav1.LibvirtClusterSpec) {
		s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
		s.LoadBalancer = infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone}
		s.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.0.2.100", Port: 6443}
		s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "fd-a", URI: a, ControlPlane: ptr.To(true)}, {Name: "fd-b", URI: b, ControlPlane: ptr.To(true)}, {Name: "fd-c", URI: b}}
	})().(*infrav1.LibvirtCluster)
	lc.Namespace, lc.Name = namespace, name("fdfixed", 0)
	lc.Labels = map[string]string{clusterv1.ClusterNameLabel: lc.Name}
	if err := create(t, lc); err != nil {
		t.Fatal(err)
	}
	lm := machine(func(s *infrav1.LibvirtMachineSpec) { s.FailureDomain = "fd-a" })().(*infrav1.LibvirtMachine)
	lm.Namespace, lm.Name = namespace, name("fdfixed-m", 0)
	lm.Labels = map[string]string{clusterv1.ClusterNameLabel: lc.Name}
	if err := create(t, lm); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		edit   func([]infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec
		refuse bool
	}{
		{"the used domain's host swapped", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec {
			f[0].URI, f[1].URI = f[1].URI, f[0].URI
			return f
		}, true},
		{"the used domain removed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec { return f[1:] }, true},
		{"an unused domain's host changed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec {
			f[2].URI = a
			return f
		}, false},
		{"an unused domain removed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec { return f[:2] }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := &infrav1.LibvirtCluster{}
			if err := c.Get(ctx(t), client.ObjectKeyFromObject(lc), cur); err != nil {
				t.Fatal(err)
			}
			cur.Spec.FailureDomains = tc.edit(slices.Clone(cur.Spec.FailureDomains))
			err := c.Update(ctx(t), cur)
			if tc.refuse && (err == nil || !strings.Contains(err.Error(), lm.Name)) {
				t.Fatalf("update: %v, want a refusal naming %s", err, lm.Name)
			}
			if !tc.refuse && err != nil {
				t.Fatal(err)
			}
		})
	}
}
