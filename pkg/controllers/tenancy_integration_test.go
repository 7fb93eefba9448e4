package controllers_test

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
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
	domainA := scope.DomainName(nsA, "cp-0")
	rootA, seedA := scope.OverlayVolumeName(domainA), scope.SeedVolumeName(domainA)
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
	for _, c := range cases {
		h.createMachine(c.machine, machineOpts{cluster: "b", withData: true, image: &infrav1.ImageSource{Volume: &c.ref}})
	}
	for _, c := range cases {
		lm := h.waitCondition(c.machine, infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.ImageNotAllowedReason, time.Minute)
		t.Logf("%s: %s", c.machine, conditions.Get(lm, infrav1.DiskReadyCondition).Message)
	}
	// Give a wrongly continuing reconcile time to create something.
	time.Sleep(3 * time.Second)
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
		h.deleteMachine(c.machine, time.Minute)
		h.assertClean(c.machine, "")
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
