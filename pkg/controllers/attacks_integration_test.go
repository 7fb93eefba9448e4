package controllers_test

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestMoveMarkerCannotOrphan: a tenant's delete-for-move marker on its own
// running machine. With the Cluster not paused (no move can be under way)
// the marker is ignored and the machine is deleted as any other: domain,
// volumes and reservation gone. With the Cluster paused the provider lets
// go of it as a move needs, leaving the VM; the VM still counts against
// the namespace's --namespace-max-machines, so the next machine waits with
// NamespaceQuotaExceeded and nothing is created for it.
//
// On the code before this test the first delete released the machine at
// once (its domain stayed, assertClean failed) and the third machine got a
// domain (the orphan no longer counted).
func TestMoveMarkerCannotOrphan(t *testing.T) {
	h := newHarness(t)
	h.options = func(o *manager.Options) { o.NamespaceMaxMachines = 1 }
	h.startProvider(nil)
	const cluster = "q"
	h.createCluster(cluster, true)

	// Not paused: a real deletion.
	h.createMachine("a", machineOpts{cluster: cluster, withData: true})
	h.waitCondition("a", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 5*time.Minute)
	macA := h.lm("a").Status.Domain.MAC
	h.markAndDelete("a")
	h.waitFor("a deleted", 3*time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "a"}, &infrav1.LibvirtMachine{})
		return apierrors.IsNotFound(err), "still there"
	})
	h.assertClean("a", macA)

	// Paused: released as a move needs, VM left running.
	h.createMachine("b", machineOpts{cluster: cluster, withData: true})
	h.waitCondition("b", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 5*time.Minute)
	macB := h.lm("b").Status.Domain.MAC
	h.setClusterPaused(cluster, true)
	h.deleteForMove(&infrav1.LibvirtMachine{}, "b")
	h.setClusterPaused(cluster, false)
	orphan := naming.DomainName(h.ns, "b")
	if _, err := h.host.DomainInfo(h.ctx, orphan); err != nil {
		t.Fatalf("the moved machine's domain: %v (a move must leave it)", err)
	}

	// The orphan still counts.
	h.createMachine("c", machineOpts{cluster: cluster, withData: true})
	lm := h.waitCondition("c", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.NamespaceQuotaExceededReason, 2*time.Minute)
	t.Logf("c: %s", conditions.Get(lm, infrav1.DomainReadyCondition).Message)
	h.assertNoLibvirtObjects("c")

	macC := h.machineMACs("c")
	h.deleteMachine("c", 2*time.Minute)
	h.assertClean("c", macC...)

	// The operator's clean-up (capl-dev orphans --delete): the orphan's
	// domain and volumes are found, nothing of a machine that exists.
	found, err := plane.FindOrphans(h.ctx, h.c, h.host, plane.Scope{})
	must(t, err)
	var mine []plane.Orphan
	for _, o := range found {
		if o.Kind == virt.OwnedNetwork {
			continue // the harness's network, which no LibvirtCluster names
		}
		if o.Namespace != h.ns {
			// Another test process's, whose API server this one is not:
			// make test runs the LibvirtCluster tests beside these.
			continue
		}
		if !quota.OfDomain(orphan, o.OwnedObject) {
			t.Errorf("%s listed as an orphan", o)
			continue
		}
		mine = append(mine, o)
	}
	if len(mine) < 3 {
		t.Errorf("orphans of %s: %v, want its domain, root disk and seed", orphan, mine)
	}
	must(t, plane.RemoveOrphans(h.ctx, h.host, mine))
	must(t, h.host.ReleaseAddress(h.ctx, h.network.Name, netalloc.MAC(macB)))
	h.assertClean("b", macB)
}

// markAndDelete puts clusterctl's delete-for-move marker on a machine and
// deletes it, as a tenant can, whatever its Cluster's state.
func (h *harness) markAndDelete(name string) {
	h.t.Helper()
	lm := &infrav1.LibvirtMachine{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lm))
	must(h.t, h.c.Patch(h.ctx, lm, testenv.DeleteForMovePatch()))
	must(h.t, h.c.Delete(h.ctx, lm))
}

// TestForgedMACAnnotation: a machine created with another machine's MAC in
// its MAC annotation (the victim's DHCP reservation on the shared
// network) is refused (AddressReserved MACNotOwned: the provider did not
// derive that MAC and no domain of the thief uses it), gets no domain, and
// deleting it leaves the victim's reservation in place. The same on the
// segments where no DHCP entry is made (testForgedMACOnSharedSegments): a
// pool address on an operator's libvirt network and a host bridge.
// Domains are defined, never started.
//
// On the code before the entry check the thief shared the victim's entry
// (AddressReserved True) and its deletion removed it; before the MAC
// check, the DHCP thief was refused only by the entry's name
// (AddressConflict), and the pool thief got AddressReserved True and a
// domain with the victim's MAC.
func TestForgedMACAnnotation(t *testing.T) {
	h := newHarness(t)
	h.options = func(o *manager.Options) { grantPools(o, "10.212.0.0/14") }
	h.startProvider(definedOnly)
	const cluster = "shared"
	h.createCluster(cluster, true)
	h.createMachine("victim", machineOpts{cluster: cluster, withData: true})
	h.waitCondition("victim", infrav1.AddressReservedCondition, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)
	mac := h.lm("victim").Annotations[scope.MACAnnotation]
	if mac == "" {
		t.Fatal("the victim recorded no MAC")
	}
	reservedIP := func() string {
		entries, err := h.host.Reservations(h.ctx, h.network.Name)
		must(t, err)
		for _, e := range entries {
			if netalloc.SameMAC(e.MAC.String(), mac) {
				return e.IP.String()
			}
		}
		return ""
	}
	ip := reservedIP()
	if ip == "" {
		t.Fatal("the victim's reservation is missing")
	}

	h.createMachine("thief", machineOpts{cluster: cluster, withData: true, annotations: map[string]string{scope.MACAnnotation: mac}})
	lm := h.waitCondition("thief", infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.MACNotOwnedReason, 2*time.Minute)
	msg := conditions.Get(lm, infrav1.AddressReservedCondition).Message
	t.Logf("thief: %s", msg)
	if !strings.Contains(msg, mac) {
		t.Errorf("AddressReserved %q, want the MAC named", msg)
	}
	if _, err := h.host.DomainInfo(h.ctx, naming.DomainName(h.ns, "thief")); !virt.IsNotFound(err) {
		t.Errorf("the thief has a domain (err %v)", err)
	}
	h.deleteMachine("thief", 2*time.Minute)
	if got := reservedIP(); got != ip {
		t.Errorf("after the thief's deletion the victim's reservation is %q, was %s", got, ip)
	}
	h.assertClean("thief", "")

	testForgedMACOnSharedSegments(h)
}
