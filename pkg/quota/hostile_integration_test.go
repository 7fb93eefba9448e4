package quota_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/quota"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestHostileHostOnLibvirt: the attack of a tenant's own libvirtd under
// --libvirt-uris=*, with libvirt answering. libvirt's test driver stands
// in for team-a's host (only its answers matter): it reports a domain
// with the provider's ownership metadata tagged team-b (16 vCPUs) and one
// tagged team-a. The manager's own host is the real libvirtd. team-b,
// whose clusters do not name team-a's host, is admitted; team-a, whose
// cluster does, counts what its host reports. The API server is a fake
// client: it only tells which hosts team-a's cluster names.
func TestHostileHostOnLibvirt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mine := testlibvirt.Client(t, testlibvirt.URI(t))
	// The test driver's state lives while a connection to it is open:
	// this one defines the domains, the ledger's client lists them.
	conn, err := libvirt.NewConnect("test:///default")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Close() }()
	forge := func(ns, name string, vcpus int) {
		md, err := virt.Owner{Kind: "LibvirtMachine", Namespace: ns, Name: name}.MetadataXML()
		if err != nil {
			t.Fatal(err)
		}
		d, err := conn.DomainDefineXML(fmt.Sprintf(`<domain type='test'><name>capltest-%s-%s</name><memory unit='MiB'>1024</memory>`+
			`<vcpu>%d</vcpu><os><type>hvm</type></os><metadata>%s</metadata></domain>`, ns, name, vcpus, md))
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Free()
	}
	forge("capltest-team-b", "forged", 16)
	forge("capltest-team-a", "own", 4)
	hostile, err := virt.Dial(ctx, "test:///default")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hostile.Close() }()
	hs := &hostSet{m: map[string]quota.Lister{managerURI: mine, tenantURI: hostile}}
	newB := machine("capltest-team-b", "new", 0, 2, 512, 4)
	newA := machine("capltest-team-a", "new", 0, 5, 512, 4)
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(namingCluster("capltest-team-a", "a", tenantURI), newA, newB).Build()
	// Each host is waited for as long as a busy libvirtd may take.
	l := quota.NewLedger(tenancy.Limits{VCPUs: 8}, api, hs.hosts, quota.WithSharedHosts(shared), quota.WithListTimeout(time.Minute))
	if err := admitWithin(t, l, newB); err != nil {
		t.Errorf("team-b, 2 vCPUs of 8, 16 more tagged team-b on team-a's host: %v; want it admitted", err)
	}
	if err := admitWithin(t, l, newA); err == nil || !strings.Contains(err.Error(), "--namespace-max-vcpus") {
		t.Errorf("team-a, 4 vCPUs on its own host + 5 of 8: %v; want a refusal", err)
	}
}
