package quota_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const gib = 1 << 30

var base = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func machine(ns, name string, created time.Duration, cpus, memoryMiB, diskGiB int32) *infrav1.LibvirtMachine {
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(base.Add(created))}}
	lm.Spec.CPUs, lm.Spec.MemoryMiB, lm.Spec.DiskSizeGiB = cpus, memoryMiB, diskGiB
	return lm
}

// withDataDisk gives lm a data disk of sizeGiB.
func withDataDisk(lm *infrav1.LibvirtMachine, sizeGiB int32) *infrav1.LibvirtMachine {
	lm.Spec.DataDisks = append(lm.Spec.DataDisks, infrav1.DataDisk{Name: "data", SizeGiB: sizeGiB})
	return lm
}

func cluster(ns, name string, created time.Duration, lb infrav1.LoadBalancerType) *infrav1.LibvirtCluster {
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(base.Add(created))}}
	lc.Spec.LoadBalancer.Type = lb
	return lc
}

// domain is a VM of owner kind/ns/name as ListOwned reports it.
func domain(kind, ns, name string, vcpus, memoryMiB int64) virt.OwnedObject {
	n := naming.DomainName(ns, name)
	if kind == "LibvirtCluster" {
		n = naming.LoadBalancerDomainName(ns, name)
	}
	return virt.OwnedObject{Kind: virt.OwnedDomain, Name: n, Owner: &virt.Owner{Kind: kind, Namespace: ns, Name: name}, VCPUs: vcpus, MemoryMiB: memoryMiB}
}

// listing is a host's fixed listing of owned objects.
type listing []virt.OwnedObject

func (l listing) ListOwned(context.Context) ([]virt.OwnedObject, error) { return l, nil }

func ledger(t *testing.T, limits tenancy.Limits, objs []virt.OwnedObject, api ...client.Object) *quota.Ledger {
	t.Helper()
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(api...).Build()
	return quota.NewLedger(limits, c, func() map[string]quota.Lister { return map[string]quota.Lister{"test:///": listing(objs)} })
}

func admitMachine(l *quota.Ledger, lm *infrav1.LibvirtMachine) error {
	d := naming.DomainName(lm.Namespace, lm.Name)
	return l.Admit(context.Background(), quota.Request{
		Object: lm,
		Own:    func(o virt.OwnedObject) bool { return quota.OfDomain(d, o) },
		Ask:    func(h quota.Holdings) tenancy.Usage { return quota.MachineAsk(lm, h) },
	})
}

func admitCluster(l *quota.Ledger, lc *infrav1.LibvirtCluster) error {
	lb := naming.LoadBalancerDomainName(lc.Namespace, lc.Name)
	return l.Admit(context.Background(), quota.Request{
		Object: lc,
		Own:    func(o virt.OwnedObject) bool { return quota.OfDomain(lb, o) },
		Ask:    func(h quota.Holdings) tenancy.Usage { return quota.ClusterAsk(lc, h) },
	})
}

// TestEachTotal passes one namespace total at a time, the others left
// unbounded, so that each refusal is its own total's: the ledger counts
// what the namespace holds in libvirt (an orphaned VM included), what its
// objects created earlier ask for, and the new object.
func TestEachTotal(t *testing.T) {
	orphan := domain("LibvirtMachine", "team-b", "gone", 2, 2048)
	other := domain("LibvirtMachine", "team-a", "big", 32, 65536) // another namespace: never counted
	overlay := virt.OwnedObject{Kind: virt.OwnedVolume, Name: naming.OverlayVolumeName(naming.DomainName("team-b", "gone")), CapacityBytes: 10 * gib, AllocationBytes: gib}
	seed := virt.OwnedObject{Kind: virt.OwnedVolume, Name: naming.SeedVolumeName(naming.DomainName("team-b", "gone")), CapacityBytes: gib, AllocationBytes: gib / 2}
	lbNet := virt.OwnedObject{Kind: virt.OwnedNetwork, Name: naming.ClusterNetworkName("team-b", "old"), Owner: &virt.Owner{Kind: "LibvirtCluster", Namespace: "team-b", Name: "old"}}
	data := virt.OwnedObject{Kind: virt.OwnedVolume, Name: naming.DataDiskVolumeName(naming.DomainName("team-b", "gone"), "etcd"), CapacityBytes: 3 * gib, AllocationBytes: gib / 4}
	held := []virt.OwnedObject{orphan, other, overlay, seed, data, lbNet}
	ahead := machine("team-b", "ahead", 0, 2, 1024, 4)
	for _, tc := range []struct {
		name   string
		limits tenancy.Limits
		ask    *infrav1.LibvirtMachine
		want   string // the flag named, "" for admitted
	}{
		{"machines: the orphan and the one ahead fill two", tenancy.Limits{Machines: 2}, machine("team-b", "new", time.Second, 1, 512, 4), "--namespace-max-machines"},
		{"machines: room for three", tenancy.Limits{Machines: 3}, machine("team-b", "new", time.Second, 1, 512, 4), ""},
		{"vcpus: 2 held + 2 ahead + 1", tenancy.Limits{VCPUs: 4}, machine("team-b", "new", time.Second, 1, 512, 4), "--namespace-max-vcpus"},
		{"vcpus: exactly at the total", tenancy.Limits{VCPUs: 5}, machine("team-b", "new", time.Second, 1, 512, 4), ""},
		{"memory: 2048 held + 1024 ahead + 1024", tenancy.Limits{MemoryMiB: 4000}, machine("team-b", "new", time.Second, 1, 1024, 4), "--namespace-max-memory"},
		{"memory: within", tenancy.Limits{MemoryMiB: 4096}, machine("team-b", "new", time.Second, 1, 1024, 4), ""},
		{"disk: overlay and data disk at their capacity, seed as allocated, ahead and new as asked", tenancy.Limits{DiskGiB: 21}, machine("team-b", "new", time.Second, 1, 512, 4), "--namespace-max-disk"},
		{"disk: within", tenancy.Limits{DiskGiB: 22}, machine("team-b", "new", time.Second, 1, 512, 4), ""},
		{"disk: the new machine's data disks count", tenancy.Limits{DiskGiB: 22}, withDataDisk(machine("team-b", "new", time.Second, 1, 512, 4), 1), "--namespace-max-disk"},
		{"created before the one ahead: it does not count", tenancy.Limits{Machines: 2}, machine("team-b", "first", -time.Second, 1, 512, 4), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := ledger(t, tc.limits, held, ahead, tc.ask)
			err := admitMachine(l, tc.ask)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal naming %s", err, tc.want)
			case tc.want != "" && strings.Count(err.Error(), "--namespace-max-") != 1:
				t.Fatalf("%v: want exactly one total passed", err)
			}
		})
	}
}

// TestClusters: a LibvirtCluster counts once, by its network or its
// HAProxy VM, and its HAProxy VM's vCPUs and memory count with the
// machines'.
func TestClusters(t *testing.T) {
	held := []virt.OwnedObject{
		{Kind: virt.OwnedNetwork, Name: naming.ClusterNetworkName("team-b", "one"), Owner: &virt.Owner{Kind: "LibvirtCluster", Namespace: "team-b", Name: "one"}},
		domain("LibvirtCluster", "team-b", "one", 1, 512),
	}
	second := cluster("team-b", "two", time.Second, infrav1.LoadBalancerHAProxy)
	if err := admitCluster(ledger(t, tenancy.Limits{Clusters: 1}, held, second), second); err == nil || !strings.Contains(err.Error(), "--namespace-max-clusters") {
		t.Errorf("second cluster with a total of one: %v", err)
	}
	if err := admitCluster(ledger(t, tenancy.Limits{Clusters: 2}, held, second), second); err != nil {
		t.Errorf("second cluster with a total of two: %v", err)
	}
	// The held HAProxy VM (1 vCPU) and the new one (1 by default) and a machine of 1.
	lm := machine("team-b", "m", 2*time.Second, 1, 512, 4)
	if err := admitMachine(ledger(t, tenancy.Limits{VCPUs: 2}, held, second, lm), lm); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("machine after two HAProxy VMs with 2 vCPUs in all: %v", err)
	}
	none := cluster("team-b", "none", 3*time.Second, infrav1.LoadBalancerNone)
	if err := admitMachine(ledger(t, tenancy.Limits{VCPUs: 2}, held, none, lm), lm); err != nil {
		t.Errorf("a cluster without HAProxy VM takes no vCPUs: %v", err)
	}
	// A cluster that holds its network and VM already is admitted
	// whatever the totals (its reconciles go on).
	one := cluster("team-b", "one", 0, infrav1.LoadBalancerHAProxy)
	if err := admitCluster(ledger(t, tenancy.Limits{Clusters: 1, VCPUs: 1}, held, one), one); err != nil {
		t.Errorf("a cluster that holds what it needs: %v", err)
	}
}

// TestAdmissionsTogether: two machines created in the same second share
// a namespace with room for one. "b" lists the namespace before "a" is
// there, and "a" asks to be admitted while "b" is between that listing and
// its admission. Neither is ahead of the other by what it saw: "a" does
// not count "b" by creation order (the same second, and "a" sorts first),
// only once "b" is admitted; "b" never saw "a". Only the namespace's lock,
// which makes "a" wait for "b", admits one of them; without it both pass.
func TestAdmissionsTogether(t *testing.T) {
	a, b := machine("team-b", "a", 0, 1, 512, 4), machine("team-b", "b", 0, 1, 512, 4)
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	api := &pausingReader{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(a, b).Build(), hide: "a", aListed: make(chan struct{})}
	l := quota.NewLedger(tenancy.Limits{Machines: 1}, api, func() map[string]quota.Lister { return map[string]quota.Lister{"test:///": listing(nil)} })
	aErr := make(chan error, 1)
	api.during = func() {
		go func() { aErr <- admitMachine(l, a) }()
		select {
		case <-api.aListed: // not kept out: let it finish first
			err := <-aErr
			aErr <- err
			t.Logf("a's admission ran while b's was under way: %v", err)
		case <-time.After(2 * time.Second): // waits for b's admission
		}
	}
	bErr := admitMachine(l, b)
	if err := <-aErr; (err == nil) == (bErr == nil) {
		t.Errorf("with room for one machine: a's admission %v, b's %v; want exactly one admitted", err, bErr)
	}
	if bErr != nil {
		t.Errorf("b, admitted first, was refused: %v", bErr)
	}
}

// pausingReader is an API server on which the first listing of
// LibvirtMachines (b's admission's) is made before hide was created, and
// is followed by during; a later listing closes aListed.
type pausingReader struct {
	client.Reader
	hide    string
	during  func()
	aListed chan struct{}
	mu      sync.Mutex
	lists   int
}

func (r *pausingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := r.Reader.List(ctx, list, opts...); err != nil {
		return err
	}
	ml, ok := list.(*infrav1.LibvirtMachineList)
	if !ok {
		return nil
	}
	r.mu.Lock()
	r.lists++
	n := r.lists
	r.mu.Unlock()
	switch n {
	case 1:
		ml.Items = slices.DeleteFunc(ml.Items, func(lm infrav1.LibvirtMachine) bool { return lm.Name == r.hide })
		r.during()
	case 2:
		close(r.aListed)
	}
	return nil
}

// TestHoldImages: an imported image counts, at its allocation, for each
// namespace with a root disk backed by it, and for no other.
func TestHoldImages(t *testing.T) {
	img := virt.ImageUse{Volume: virt.VolumeInfo{Name: naming.ImageVolumeName("ab12ab12ab12ab12ab12ab12ab12ab12"), AllocationBytes: 3 * gib},
		Users: []virt.VolumeRef{{Pool: "p", Name: naming.OverlayVolumeName(naming.DomainName("ns", "m1"))}, {Pool: "p", Name: naming.OverlayVolumeName(naming.DomainName("ns", "m2"))}}}
	unused := virt.ImageUse{Volume: virt.VolumeInfo{Name: naming.ImageVolumeName("cd34cd34cd34cd34cd34cd34cd34cd34"), AllocationBytes: 5 * gib}}
	uses := []virt.ImageUse{img, unused}
	if got := quota.Hold("ns", nil, uses, nil).DiskGiB; got != 3 {
		t.Errorf("ns holds %d GiB of images, want 3 (the image its disks use, once)", got)
	}
	if got := quota.Hold("other", nil, uses, nil).DiskGiB; got != 0 {
		t.Errorf("another namespace holds %d GiB of images, want 0", got)
	}
}

// TestHold: what ListOwned reports is summed per namespace.
func TestHold(t *testing.T) {
	objs := []virt.OwnedObject{
		domain("LibvirtMachine", "ns", "m1", 2, 1024),
		domain("LibvirtMachine", "ns", "m2", 1, 512),
		domain("LibvirtCluster", "ns", "c", 1, 512),
		domain("LibvirtMachine", "other", "m1", 8, 8192),
		{Kind: virt.OwnedNetwork, Name: naming.ClusterNetworkName("ns", "c"), Owner: &virt.Owner{Kind: "LibvirtCluster", Namespace: "ns", Name: "c"}},
		{Kind: virt.OwnedVolume, Name: naming.OverlayVolumeName(naming.DomainName("ns", "m1")), CapacityBytes: 4 * gib, AllocationBytes: gib},
		{Kind: virt.OwnedVolume, Name: naming.ConsoleLogVolumeName(naming.DomainName("ns", "m1")), AllocationBytes: gib / 4},
		{Kind: virt.OwnedVolume, Name: naming.OverlayVolumeName(naming.DomainName("other", "m1")), CapacityBytes: 100 * gib},
	}
	h := quota.Hold("ns", objs, nil, nil)
	want := tenancy.Usage{Machines: 2, Clusters: 1, VCPUs: 4, MemoryMiB: 2048, DiskGiB: 5}
	if h.Usage != want {
		t.Errorf("held %+v, want %+v", h.Usage, want)
	}
	mine := naming.DomainName("ns", "m1")
	h = quota.Hold("ns", objs, nil, func(o virt.OwnedObject) bool { return quota.OfDomain(mine, o) })
	want = tenancy.Usage{Machines: 1, Clusters: 1, VCPUs: 2, MemoryMiB: 1024}
	if h.Usage != want || !h.Domains[mine] {
		t.Errorf("held without m1 %+v (domains %v), want %+v with m1's name kept", h.Usage, h.Domains, want)
	}
}
