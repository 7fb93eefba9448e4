package controllers_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// TestMoveAdoptsLibvirtObjects: a cluster with its HAProxy VM and a
// machine with its domain, then both objects recreated as clusterctl move
// (or a restore) recreates them: new UIDs, no status, the same spec,
// labels and annotations, the Cluster paused meanwhile. The provider adopts
// what libvirt holds: the same domain UUIDs (the machine's providerID
// unchanged), the same MACs and reservations, the same volumes (the seed
// not rewritten), no second domain, and the conditions come back True.
func TestMoveAdoptsLibvirtObjects(t *testing.T) {
	h := newClusterHarness(t)
	h.startProvider(nil)
	const cluster, worker = "mv", "w0"
	h.createCluster(cluster, clusterOpts{spec: infrav1.LibvirtClusterSpec{LoadBalancer: infrav1.LoadBalancer{
		Type:            infrav1.LoadBalancerHAProxy,
		Image:           &infrav1.ImageSource{URL: "file://" + h.lbImage, Checksum: "sha256:" + h.lbImageSum},
		VirtualHardware: tcgHardware(),
	}}})
	// While its creation is in flight the cluster blocks a move.
	h.waitCluster(cluster, "blocking a move while it is created", time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		_, blocked := lc.Annotations[clusterctlv1.BlockMoveAnnotation]
		return blocked || lc.Status.Initialization.IsProvisioned(), "no block-move annotation"
	})
	h.waitCluster(cluster, "provisioned", 5*time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return lc.Status.Initialization.IsProvisioned(), "not provisioned"
	})
	h.createMachine(worker, machineOpts{cluster: cluster, withData: true})
	h.waitCondition(worker, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 5*time.Minute)
	h.waitFor("no move blocked once the machine's domain is defined", time.Minute, func() (bool, string) {
		_, lmBlocked := h.lm(worker).Annotations[clusterctlv1.BlockMoveAnnotation]
		_, lcBlocked := h.lc(cluster).Annotations[clusterctlv1.BlockMoveAnnotation]
		return !lmBlocked && !lcBlocked, fmt.Sprintf("machine blocks %v, cluster blocks %v", lmBlocked, lcBlocked)
	})

	network := h.lc(cluster).Status.Network.Name
	before := h.libvirtIdentity(cluster, worker, network)
	t.Logf("before the move: %+v", before)

	// As clusterctl move does: pause, then on the source annotate each
	// object delete-for-move and delete it, its finalizer still on; the
	// provider lets go of it without touching libvirt. Then the target
	// creates the objects anew.
	h.setClusterPaused(cluster, true)
	oldLM, oldLC := h.lm(worker), h.lc(cluster)
	h.deleteForMove(&infrav1.LibvirtMachine{}, worker)
	h.deleteForMove(&infrav1.LibvirtCluster{}, cluster)
	if got := h.libvirtIdentity(cluster, worker, network); fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", before) {
		t.Fatalf("deleting the source objects changed libvirt:\nbefore %+v\nafter  %+v", before, got)
	}
	h.create(oldLM)
	h.create(oldLC)
	if h.lm(worker).UID == oldLM.UID || h.lc(cluster).UID == oldLC.UID {
		t.Fatal("the objects kept their UIDs")
	}
	h.setClusterPaused(cluster, false)

	h.waitCluster(cluster, "provisioned again", 5*time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return lc.Status.Initialization.IsProvisioned(), "not provisioned"
	})
	for _, c := range []string{infrav1.AddressReservedCondition, infrav1.DiskReadyCondition, infrav1.BootstrapDataReadyCondition, infrav1.DomainReadyCondition} {
		h.waitCondition(worker, c, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)
	}
	after := h.libvirtIdentity(cluster, worker, network)
	t.Logf("after the move: %+v", after)
	if fmt.Sprintf("%+v", after) != fmt.Sprintf("%+v", before) {
		t.Errorf("libvirt changed across the move:\nbefore %+v\nafter  %+v", before, after)
	}
	if lm := h.lm(worker); lm.Spec.ProviderID != oldLM.Spec.ProviderID {
		t.Errorf("providerID %q, was %q", lm.Spec.ProviderID, oldLM.Spec.ProviderID)
	}
}

// movedIdentity is what libvirt holds of a cluster and its machine.
type movedIdentity struct {
	LBUUID, LBMAC, MachineUUID, MachineMAC string
	Domains, Volumes, Reservations         []string
	SeedSHA256                             string
}

// libvirtIdentity reads movedIdentity from libvirt (not from the objects).
func (h *clusterHarness) libvirtIdentity(cluster, machine, network string) movedIdentity {
	h.t.Helper()
	var id movedIdentity
	lb, err := h.host.DomainInfo(h.ctx, naming.LoadBalancerDomainName(h.ns, cluster))
	must(h.t, err)
	id.LBUUID, id.LBMAC = lb.UUID, strings.ToLower(lb.MAC.String())
	dom := naming.DomainName(h.ns, machine)
	m, err := h.host.DomainInfo(h.ctx, dom)
	must(h.t, err)
	id.MachineUUID, id.MachineMAC = m.UUID, strings.ToLower(m.MAC.String())
	objs, err := testlibvirt.Scan(h.uri)
	must(h.t, err)
	for _, o := range objs {
		if o.Kind == testlibvirt.KindDomain && strings.Contains(o.Name, h.ns) {
			id.Domains = append(id.Domains, o.Name)
		}
	}
	id.Volumes = h.poolVolumes()
	entries, err := h.host.Reservations(h.ctx, network)
	must(h.t, err)
	for _, e := range entries {
		id.Reservations = append(id.Reservations, strings.ToLower(e.MAC.String())+"="+e.IP.String())
	}
	slices.Sort(id.Domains)
	slices.Sort(id.Reservations)
	seed, err := h.host.VolumeInfo(h.ctx, h.pool, naming.SeedVolumeName(dom))
	must(h.t, err)
	b, err := os.ReadFile(seed.Path)
	must(h.t, err)
	id.SeedSHA256 = fmt.Sprintf("%x", sha256.Sum256(b))
	return id
}

// deleteForMove deletes the object of kind obj named name as clusterctl
// move deletes it from the source: its annotations replaced by the
// delete-for-move marker (clusterctl's own patch), finalizers left to the
// provider, which must let go of it.
func (h *harness) deleteForMove(obj client.Object, name string) {
	h.t.Helper()
	key := client.ObjectKey{Namespace: h.ns, Name: name}
	must(h.t, h.c.Get(h.ctx, key, obj))
	must(h.t, h.c.Patch(h.ctx, obj, testenv.DeleteForMovePatch()))
	must(h.t, h.c.Delete(h.ctx, obj))
	h.waitFor(name+" released by the provider", time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, key, obj.DeepCopyObject().(client.Object))
		return err != nil, fmt.Sprint(err)
	})
}

// create creates obj anew as clusterctl move's target does: the same
// labels, annotations (but delete-for-move), owner references and spec; a
// new UID and no status.
func (h *clusterHarness) create(obj client.Object) {
	h.t.Helper()
	o := obj.DeepCopyObject().(client.Object)
	o.SetUID("")
	o.SetResourceVersion("")
	o.SetCreationTimestamp(metav1.Time{})
	o.SetDeletionTimestamp(nil)
	o.SetFinalizers(nil)
	o.SetManagedFields(nil)
	a := o.GetAnnotations()
	delete(a, clusterctlv1.DeleteForMoveAnnotation)
	o.SetAnnotations(a)
	switch x := o.(type) {
	case *infrav1.LibvirtMachine:
		x.Status = infrav1.LibvirtMachineStatus{}
	case *infrav1.LibvirtCluster:
		x.Status = infrav1.LibvirtClusterStatus{}
	}
	must(h.t, h.c.Create(h.ctx, o))
}
