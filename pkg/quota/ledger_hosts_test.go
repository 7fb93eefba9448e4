package quota_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	managerURI = "qemu:///system"
	listedURI  = "qemu+ssh://rack1/system"          // the operator lists it in --libvirt-uris
	tenantURI  = "qemu+tls://team-a.example/system" // only --libvirt-uris=* admits it
)

// shared is the manager's rule: its own host and the hosts the operator
// lists count for every namespace.
func shared(uri string) bool { return uri == managerURI || uri == listedURI }

// naming returns a LibvirtCluster of ns whose one failure domain is uri.
func namingCluster(ns, name, uri string) *infrav1.LibvirtCluster {
	lc := cluster(ns, name, -time.Hour, infrav1.LoadBalancerNone)
	lc.Spec.FailureDomains = []infrav1.FailureDomainSpec{{Name: "fd", URI: uri}}
	return lc
}

// blocked is a host whose listing waits until release is closed.
type blocked struct {
	release chan struct{}
	objs    []virt.OwnedObject
}

func (b *blocked) ListOwned(ctx context.Context) ([]virt.OwnedObject, error) {
	select {
	case <-b.release:
		return b.objs, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// hostSet is the hosts the manager has open, which a test changes.
type hostSet struct{ m map[string]quota.Lister }

func (s *hostSet) hosts() map[string]quota.Lister { return s.m }

func scopedLedger(t *testing.T, limits tenancy.Limits, hs *hostSet, api ...client.Object) (*quota.Ledger, client.Client) {
	t.Helper()
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(api...).Build()
	return quota.NewLedger(limits, c, hs.hosts, quota.WithSharedHosts(shared), quota.WithListTimeout(200*time.Millisecond)), c
}

// admitWithin admits lm, failing the test when the admission does not
// return within a minute (a host's listing stalled it).
func admitWithin(t *testing.T, l *quota.Ledger, lm *infrav1.LibvirtMachine) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- admitMachine(l, lm) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("admitting %s/%s did not return within a minute", lm.Namespace, lm.Name)
		return nil
	}
}

// TestTenantHostCountsForItsNamespace: under --libvirt-uris=*, team-a
// names its own libvirtd, which reports 10 000 vCPUs of domains tagged
// team-b. They count for team-a (whose host it is) and never for team-b,
// which does not name that host; what the operator's hosts report counts
// for everyone.
func TestTenantHostCountsForItsNamespace(t *testing.T) {
	hs := &hostSet{m: map[string]quota.Lister{
		managerURI: listing{domain("LibvirtMachine", "team-b", "real", 2, 1024)},
		listedURI:  listing{domain("LibvirtMachine", "team-b", "rack", 2, 1024)},
		tenantURI: listing{
			domain("LibvirtMachine", "team-b", "forged", 10000, 1<<20),
			domain("LibvirtMachine", "team-a", "own", 4, 1024),
		},
	}}
	newB := machine("team-b", "new", 0, 2, 1024, 4)
	newA := machine("team-a", "new", 0, 3, 1024, 4)
	l, _ := scopedLedger(t, tenancy.Limits{VCPUs: 6}, hs, namingCluster("team-a", "a", tenantURI), newA, newB)
	if err := admitWithin(t, l, newB); err != nil {
		t.Errorf("team-b, 4 vCPUs held on the operator's hosts + 2 of 6: %v", err)
	}
	big := machine("team-b", "big", 0, 3, 1024, 4)
	l, _ = scopedLedger(t, tenancy.Limits{VCPUs: 6}, hs, namingCluster("team-a", "a", tenantURI), big)
	if err := admitWithin(t, l, big); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-b, 4 vCPUs held on the operator's hosts + 3 of 6: %v; want a refusal", err)
	}
	if err := admitWithin(t, l, newA); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-a, 10 000 vCPUs of team-b and 4 of its own on its own host + 3 of 6: %v; want a refusal", err)
	}
}

// TestSlowTenantHost: a tenant's host that never answers stalls no other
// namespace's admissions (they do not list it) and stalls its own only for
// the list timeout; once it answered, its last listing stands in for it
// when it is slow, and a slow operator host's last listing does too.
func TestSlowTenantHost(t *testing.T) {
	slowTenant := &blocked{release: make(chan struct{}), objs: []virt.OwnedObject{domain("LibvirtMachine", "team-a", "own", 4, 1024)}}
	slowShared := &blocked{release: make(chan struct{}), objs: []virt.OwnedObject{domain("LibvirtMachine", "team-b", "rack", 4, 1024)}}
	hs := &hostSet{m: map[string]quota.Lister{managerURI: listing(nil), tenantURI: slowTenant}}
	newA := machine("team-a", "new", 0, 4, 1024, 4)
	newB := machine("team-b", "new", 0, 4, 1024, 4)
	l, _ := scopedLedger(t, tenancy.Limits{VCPUs: 6}, hs, namingCluster("team-a", "a", tenantURI), newA, newB)

	if err := admitWithin(t, l, newB); err != nil {
		t.Errorf("team-b, whose clusters name no slow host: %v", err)
	}
	err := admitWithin(t, l, newA)
	if err == nil || !strings.Contains(err.Error(), "has not answered within") {
		t.Errorf("team-a, whose own host was never listed: %v; want it to wait for its host", err)
	}
	close(slowTenant.release) // it answers once...
	deadline := time.Now().Add(30 * time.Second)
	for err = admitWithin(t, l, newA); err != nil && strings.Contains(err.Error(), "has not answered") && time.Now().Before(deadline); err = admitWithin(t, l, newA) {
		time.Sleep(50 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Fatalf("team-a, 4 vCPUs on its host + 4 of 6: %v; want a refusal", err)
	}
	slowTenant.release = make(chan struct{}) // ...then stalls: its last listing counts
	if err := admitWithin(t, l, newA); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-a, its host stalled after one listing: %v; want the last listing counted", err)
	}

	// An operator's host that stalls after one listing: its last listing
	// counts for team-b, which is not stalled.
	hs.m = map[string]quota.Lister{managerURI: listing(nil), listedURI: slowShared}
	close(slowShared.release)
	for err = admitWithin(t, l, newB); err != nil && strings.Contains(err.Error(), "has not answered") && time.Now().Before(deadline); err = admitWithin(t, l, newB) {
		time.Sleep(50 * time.Millisecond)
	}
	slowShared.release = make(chan struct{})
	if err := admitWithin(t, l, newB); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-b, the operator's host stalled after listing 4 of its vCPUs: %v; want a refusal", err)
	}
}

// TestClosedHostStillCounts: the orphans team-a left on its own host
// still count once its last cluster naming the host is gone and the
// manager closed the host: Retire takes the host's last listing.
func TestClosedHostStillCounts(t *testing.T) {
	tenant := listing{domain("LibvirtMachine", "team-a", "orphan", 4, 1024)}
	hs := &hostSet{m: map[string]quota.Lister{managerURI: listing(nil), tenantURI: tenant}}
	lc := namingCluster("team-a", "a", tenantURI)
	newA := machine("team-a", "new", 0, 4, 1024, 4)
	l, c := scopedLedger(t, tenancy.Limits{VCPUs: 6}, hs, lc, newA)
	if err := admitWithin(t, l, newA); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Fatalf("team-a with 4 vCPUs on its host + 4 of 6: %v; want a refusal", err)
	}
	if err := c.Delete(context.Background(), lc); err != nil {
		t.Fatal(err)
	}
	l.Retire(context.Background(), tenantURI, tenant) // the pruner closes it
	hs.m = map[string]quota.Lister{managerURI: listing(nil)}
	if err := admitWithin(t, l, newA); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-a after its host was closed, its orphan left there: %v; want a refusal", err)
	}
}

// TestNamespaceHostDevices: the PCI devices a namespace's domains pass
// through count against --namespace-max-host-devices, with those its new
// machine asks for.
func TestNamespaceHostDevices(t *testing.T) {
	held := domain("LibvirtMachine", "team-b", "gpu", 2, 1024)
	held.HostDevices = 1
	other := domain("LibvirtMachine", "team-a", "gpus", 2, 1024)
	other.HostDevices = 4
	for _, tc := range []struct {
		name    string
		devices []string
		limit   int
		want    string
	}{
		{"one held, one asked, room for two", []string{"gpu0"}, 2, ""},
		{"one held, two asked, room for two", []string{"gpu0", "gpu1"}, 2, "--namespace-max-host-devices"},
		{"one held, none asked", nil, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lm := machine("team-b", "new", 0, 1, 512, 4)
			for _, d := range tc.devices {
				lm.Spec.HostDevices = append(lm.Spec.HostDevices, infrav1.HostDevice{Name: d})
			}
			err := admitMachine(ledger(t, tenancy.Limits{HostDevices: tc.limit}, []virt.OwnedObject{held, other}, lm), lm)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal naming %s", err, tc.want)
			}
		})
	}
}

// changing is a host whose objects a test changes, counting its listings.
type changing struct {
	mu       sync.Mutex
	objs     []virt.OwnedObject
	listings int
}

func (c *changing) ListOwned(context.Context) ([]virt.OwnedObject, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listings++
	return slices.Clone(c.objs), nil
}

func (c *changing) set(objs ...virt.OwnedObject) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objs = objs
}

func (c *changing) add(obj virt.OwnedObject) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objs = append(c.objs, obj)
}

func (c *changing) listed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.listings
}

// TestListingReuse: with WithListingReuse an admission that passes counts
// from the host's last listing, without listing it again, and stays
// exact: what the namespace made since counts as its objects' asks; a
// machine released by clusterctl move (gone from the API server, its VM
// left) or one being deleted has the host listed again, so its VM counts;
// a refusal is confirmed on a new listing, which sees room freed since.
func TestListingReuse(t *testing.T) {
	const ns = "team-a"
	for _, tc := range []struct {
		name string
		// between runs after a is admitted and its VM made: it changes
		// the API server (c) or the host.
		between func(t *testing.T, c client.Client, h *changing, a *infrav1.LibvirtMachine)
		// orphan starts the host with a VM of the namespace that no
		// object of the API server owns.
		orphan       bool
		limits       tenancy.Limits
		wantRefusal  string
		wantListings int // of the host, a's admission included
	}{
		{"a's VM made since the listing counts as a's ask", nil, false, tenancy.Limits{Machines: 1}, "--namespace-max-machines", 2},
		{"room for both: b admitted on a's admission's listing", nil, false, tenancy.Limits{Machines: 2}, "", 1},
		{"an orphan deleted by hand since: the refusal is checked again, and b admitted", func(t *testing.T, _ client.Client, h *changing, _ *infrav1.LibvirtMachine) {
			h.set(domain("LibvirtMachine", ns, "a", 1, 512))
		}, true, tenancy.Limits{Machines: 2}, "", 2},
		{"a released by clusterctl move: its VM counts from a new listing", func(t *testing.T, c client.Client, _ *changing, a *infrav1.LibvirtMachine) {
			must(t, c.Delete(context.Background(), a))
		}, false, tenancy.Limits{Machines: 1}, "--namespace-max-machines", 2},
		{"a being deleted: its VM counts from a new listing", func(t *testing.T, c client.Client, _ *changing, a *infrav1.LibvirtMachine) {
			patch := client.MergeFrom(a.DeepCopy())
			a.Finalizers = []string{"test/hold"}
			must(t, c.Patch(context.Background(), a, patch))
			must(t, c.Delete(context.Background(), a))
		}, false, tenancy.Limits{Machines: 1}, "--namespace-max-machines", 2},
		{"a released and its VM deleted by hand since: the refusal is checked again, and b admitted", func(t *testing.T, c client.Client, h *changing, a *infrav1.LibvirtMachine) {
			must(t, c.Delete(context.Background(), a))
			h.set()
		}, false, tenancy.Limits{Machines: 1}, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := machine(ns, "a", 0, 1, 512, 4)
			b := machine(ns, "b", time.Second, 1, 512, 4)
			host := &changing{}
			if tc.orphan {
				host.set(domain("LibvirtMachine", ns, "x", 1, 512))
			}
			hs := &hostSet{m: map[string]quota.Lister{managerURI: host}}
			scheme, err := manager.NewScheme()
			must(t, err)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(a, b).Build()
			l := quota.NewLedger(tc.limits, c, hs.hosts, quota.WithSharedHosts(shared), quota.WithListingReuse(time.Hour))
			if err := admitWithin(t, l, a); err != nil {
				t.Fatalf("a, the namespace's first machine: %v", err)
			}
			host.add(domain("LibvirtMachine", ns, "a", 1, 512))
			if tc.between != nil {
				tc.between(t, c, host, a)
			}
			err = admitWithin(t, l, b)
			switch {
			case tc.wantRefusal == "" && err != nil:
				t.Errorf("b refused: %v", err)
			case tc.wantRefusal != "" && (err == nil || !strings.Contains(err.Error(), tc.wantRefusal)):
				t.Errorf("b: %v, want a refusal naming %s", err, tc.wantRefusal)
			}
			if got := host.listed(); got != tc.wantListings {
				t.Errorf("the host was listed %d times, want %d", got, tc.wantListings)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
