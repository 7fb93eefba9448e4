package controllers_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestTenantIsolation: a LibvirtMachine of namespace B whose image.volume
// names namespace A's root disk or seed ISO (which holds A's bootstrap
// data) is refused by the controller, with no webhook installed to stop
// it first: DiskReady False/ImageNotAllowed, no MAC, reservation,
// overlay, seed or domain, A's volumes untouched, nothing left after
// deletion. The test pool is an image pool here (the harness declares it),
// so the refusal is the managed-volume rule, not the pool's.
//
// A's volumes are made directly in the pool under the names the provider
// gives a machine of A (scope's naming functions), instead of booting one.
func TestTenantIsolation(t *testing.T) {
	h := newHarness(t)
	nsA := testlibvirt.Name(t)
	domainA := naming.DomainName(nsA, "cp-0")
	rootA, seedA := naming.OverlayVolumeName(domainA), naming.SeedVolumeName(domainA)
	for _, v := range []string{rootA, seedA} {
		if _, err := h.host.UploadVolume(h.ctx, h.pool, v, []byte("#cloud-config\n# "+secretMarker+"\n")); err != nil {
			t.Fatalf("creating A's volume %s: %v", v, err)
		}
	}
	before := h.poolVolumes()
	infoBefore := map[string]uint64{}
	for _, v := range []string{rootA, seedA} {
		info, err := h.host.VolumeInfo(h.ctx, h.pool, v)
		must(t, err)
		infoBefore[v] = info.CapacityBytes
	}

	h.startProvider(nil)
	h.createCluster("b", true)
	cases := []struct {
		machine string
		ref     infrav1.VolumeReference
	}{
		{"steal-root", infrav1.VolumeReference{Name: rootA}},               // in the cluster's pool
		{"steal-seed", infrav1.VolumeReference{Pool: h.pool, Name: seedA}}, // pool named
	}
	activity := testenv.ActivityOf(t, "libvirtmachine")
	for _, c := range cases {
		h.createMachine(c.machine, machineOpts{cluster: "b", withData: true, image: &infrav1.ImageSource{Volume: &c.ref}})
	}
	for _, c := range cases {
		lm := h.waitCondition(c.machine, infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.ImageNotAllowedReason, time.Minute)
		t.Logf("%s: %s", c.machine, conditions.Get(lm, infrav1.DiskReadyCondition).Message)
	}
	// Whatever a wrongly continuing reconcile would create exists once the
	// controller handled every event since the machines were created.
	activity.WaitSettled(t, time.Minute)
	for _, c := range cases {
		h.assertNoLibvirtObjects(c.machine)
		if lm := h.lm(c.machine); lm.Status.Initialization.IsProvisioned() || lm.Spec.ProviderID != "" {
			t.Errorf("%s was provisioned", c.machine)
		}
	}
	if got := h.poolVolumes(); !slices.Equal(got, before) {
		t.Errorf("pool volumes changed from %v to %v", before, got)
	}

	for _, c := range cases {
		h.deleteAndAssertClean(c.machine)
	}
	for _, v := range []string{rootA, seedA} {
		info, err := h.host.VolumeInfo(h.ctx, h.pool, v)
		if err != nil || info.CapacityBytes != infoBefore[v] {
			t.Errorf("A's volume %s changed: %+v, %v", v, info, err)
		}
		must(t, h.host.DeleteVolume(h.ctx, h.pool, v))
	}
	if got := h.poolVolumes(); len(got) != 0 {
		t.Errorf("left in the pool: %v", got)
	}
}

// TestPublicNetworkRange: a LibvirtCluster whose network.cidr is a public
// range, which would become a route on the host into the tenant's bridge,
// created with no webhook installed, is refused by the controller under
// the flag's default ranges: NetworkReady False/NetworkNotAllowed naming
// --network-cidrs, and no libvirt network. The range is TEST-NET-3
// (203.0.113.0/24), public but routed nowhere, so that a regression takes
// nothing from the shared test host (8.8.8.0/24 could be its DNS).
// The reference check runs before the network step in the same reconcile
// and waits for a change, so once the condition is seen no network step
// ran or will run.
func TestPublicNetworkRange(t *testing.T) {
	const publicRange = "203.0.113.0/24"
	h := newClusterHarness(t)
	h.startProvider(nil)
	h.createCluster("public", clusterOpts{spec: infrav1.LibvirtClusterSpec{
		Network: infrav1.ClusterNetwork{CIDR: publicRange}, LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone},
		ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.168.150.10", Port: 6443},
	}})
	lc := h.waitClusterCondition("public", infrav1.NetworkReadyCondition, metav1.ConditionFalse, infrav1.NetworkNotAllowedReason, time.Minute)
	msg := conditions.Get(lc, infrav1.NetworkReadyCondition).Message
	if !strings.Contains(msg, publicRange) || !strings.Contains(msg, "--network-cidrs") {
		t.Errorf("NetworkReady message %q names neither the range nor the flag", msg)
	}
	t.Logf("NetworkNotAllowed: %s", msg)
	name := naming.ClusterNetworkName(h.ns, "public")
	if _, err := h.host.UseNetwork(h.ctx, name); !virt.IsNotFound(err) {
		t.Errorf("libvirt network %s: %v; want none", name, err)
	}
	if lc.Status.Network != nil && lc.Status.Network.Name != "" || lc.Status.Initialization.IsProvisioned() {
		t.Errorf("status records a network or provisioning: %+v", lc.Status)
	}
	h.deleteAndWait(lc, time.Minute)
}
