package hosts

import (
	"context"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestPruneKeepsListedHosts: the pruner never closes a host the manager
// keeps (the operator's --libvirt-uris, so that their orphans count in the
// namespace totals whether a cluster names them or not); a tenant's host
// no cluster names is closed, and OnPrune sees it still open first (the
// quota ledger takes its last listing). libvirt's test driver stands in
// for both hosts.
func TestPruneKeepsListedHosts(t *testing.T) {
	ctx := context.Background()
	set := NewSet(nil, "qemu:///system", "manager", fake.NewClientBuilder().Build())
	set.dial = func(ctx context.Context, _ string, opts ...virt.Option) (*virt.Client, error) {
		return virt.Dial(ctx, "test:///default", opts...)
	}
	defer func() { _ = set.Close() }()
	listed := Ref{URI: "qemu+ssh://rack1/system"}
	tenant := Ref{URI: "qemu+tls://team-a.example/system", Namespace: "team-a", Secret: ""}
	if err := set.Keep(ctx, listed); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Get(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	var pruned []string
	set.OnPrune(func(uri string, h virt.Host) {
		if _, err := h.ListOwned(ctx); err != nil {
			t.Errorf("OnPrune(%s): the host is closed already: %v", uri, err)
		}
		pruned = append(pruned, uri)
	})
	set.Prune(nil)
	if !slices.Equal(pruned, []string{tenant.URI}) {
		t.Errorf("OnPrune saw %v, want the tenant's host only", pruned)
	}
	open := set.Open()
	if _, ok := open[listed.URI]; !ok {
		t.Errorf("the listed host was closed: open %v", open)
	}
	if _, ok := open[tenant.URI]; ok {
		t.Errorf("the tenant's host no cluster names is still open")
	}
	pruned = nil
	_ = set.Close()
	if len(set.Open()) != 1 || len(pruned) != 0 {
		t.Errorf("after Close: open %v, OnPrune saw %v; want only the manager's host and no OnPrune", set.Open(), pruned)
	}
}
