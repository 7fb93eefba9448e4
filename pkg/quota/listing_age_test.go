package quota_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// countingHost is a host whose listing can change and that counts how
// often it is listed.
type countingHost struct {
	mu    sync.Mutex
	objs  []virt.OwnedObject
	lists int
}

func (h *countingHost) ListOwned(context.Context) ([]virt.OwnedObject, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lists++
	return append([]virt.OwnedObject(nil), h.objs...), nil
}

func (h *countingHost) add(o virt.OwnedObject) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.objs = append(h.objs, o)
}

func (h *countingHost) listed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lists
}

// TestAdmissionsShareAListing: a burst of admissions (a MachineDeployment
// scaled to 50) lists the host once, not once per machine: a listing
// reads every domain, network and volume of the host, so one per
// admission made creating N machines cost O(N²) (docs/performance.md).
// Each admitted machine still counts for those after it while the
// listing predates its domain.
func TestAdmissionsShareAListing(t *testing.T) {
	const n = 50
	host := &countingHost{}
	var objs []client.Object
	for i := range n {
		objs = append(objs, machine("team-b", fmt.Sprintf("m%02d", i), time.Duration(i)*time.Second, 1, 512, 4))
	}
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	l := quota.NewLedger(tenancy.Limits{Machines: n - 1}, c, func() map[string]quota.Lister { return map[string]quota.Lister{"test:///": host} })
	var refused []string
	for i := range n {
		lm := machine("team-b", fmt.Sprintf("m%02d", i), time.Duration(i)*time.Second, 1, 512, 4)
		if err := admitMachine(l, lm); err != nil {
			refused = append(refused, lm.Name)
		}
		// The reconcile defines the admitted machine's domain.
		host.add(domain("LibvirtMachine", "team-b", lm.Name, 1, 512))
	}
	if got := host.listed(); got != 1 {
		t.Errorf("%d admissions listed the host %d times; want once", n, got)
	}
	if len(refused) != 1 || refused[0] != fmt.Sprintf("m%02d", n-1) {
		t.Errorf("refused %v with room for %d machines; want only the last", refused, n-1)
	}
}

// TestListingRefreshed: a listing older than the max age is not trusted:
// what was defined on the host behind the manager's back (an orphan)
// counts from the next listing on.
func TestListingRefreshed(t *testing.T) {
	host := &countingHost{}
	first, second := machine("team-b", "first", 0, 4, 512, 4), machine("team-b", "second", 0, 4, 512, 4)
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(first, second).Build()
	l := quota.NewLedger(tenancy.Limits{VCPUs: 6}, c, func() map[string]quota.Lister { return map[string]quota.Lister{"test:///": host} },
		quota.WithListMaxAge(100*time.Millisecond))
	if err := admitMachine(l, first); err != nil {
		t.Fatalf("first machine, 4 of 6 vCPUs: %v", err)
	}
	// Deleted, and its domain with it.
	if err := c.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	l.Forget(first)
	host.add(domain("LibvirtMachine", "team-b", "orphan", 4, 512))
	time.Sleep(150 * time.Millisecond)
	if err := admitMachine(l, second); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("an orphan of 4 vCPUs defined since the last listing + 4 of 6: %v; want a refusal", err)
	}
	if got := host.listed(); got != 2 {
		t.Errorf("listed %d times; want twice (the first listing older than the max age)", got)
	}
}
