package scope_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// progress is what the steps of a reconcile set on a VM that must
// survive into the next reconcile, as a fresh scope builds the VM again.
type progress struct {
	UUID, MAC, State string
	Network          scope.NetworkRef
	Pool             string
}

func progressOf(vm *scope.VM) progress {
	return progress{UUID: vm.UUID, MAC: vm.MAC.String(), State: vm.State, Network: vm.Network, Pool: vm.Pool.Name}
}

// TestMachineVMWrittenBack: what the steps set on a machine's VM is in the
// stored LibvirtMachine after the patch (the UUID in spec.providerID, the
// MAC and placement in annotations, status.domain, the addresses and the
// seed's state), and the next reconcile's VM is built back from it. After
// clusterctl move, which keeps spec and annotations but no status, the
// identity and placement are still there.
func TestMachineVMWrittenBack(t *testing.T) {
	const uuid, mac = "6a1f7f0e-0c2b-4a55-8a9d-2b9f6c1d0e11", "52:54:00:12:34:56"
	f := servicetest.NewFixture(t)
	f.LM.Spec.ProviderID = ""
	s := f.Scope()
	vm := s.VM
	if vm.UUID != "" || vm.MAC != "" || vm.State != "" {
		t.Fatalf("a new machine's VM has identity or progress: %+v", progressOf(vm))
	}
	vm.UUID, vm.MAC, vm.State = uuid, mac, "running"
	vm.Addresses = []string{"192.168.100.7"}
	vm.BootstrapDataRemoved = true
	vm.RecordPlacement()
	if err := vm.Persist(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored := f.Stored()
	if stored.Spec.ProviderID != infrav1.ProviderIDPrefix+uuid || stored.Annotations[scope.MACAnnotation] != mac ||
		stored.Annotations[scope.PoolAnnotation] != "pool" || stored.Annotations[scope.NetworkAnnotation] != "network:net" {
		t.Errorf("identity and placement not written back: providerID %q, annotations %v", stored.Spec.ProviderID, stored.Annotations)
	}
	d := stored.Status.Domain
	if d == nil || d.UUID != uuid || d.MAC != mac || d.State != "running" || d.Host != "host1" || !stored.Status.BootstrapDataRemoved {
		t.Errorf("status.domain %+v, bootstrapDataRemoved %v", d, stored.Status.BootstrapDataRemoved)
	}
	if a := stored.Status.Addresses; len(a) != 2 || a[0].Address != "192.168.100.7" || a[1].Address != "m0" {
		t.Errorf("status.addresses %v", a)
	}

	want := progressOf(vm)
	if got := progressOf(f.Scope().VM); got != want {
		t.Errorf("next reconcile's VM differs from what was written back (-want +got):\n%s", cmp.Diff(want, got))
	}

	// clusterctl move: spec and annotations, no status; the network the
	// cluster reports is gone too, the recorded one stays.
	f.LM.Status = infrav1.LibvirtMachineStatus{}
	f.LC.Status.Network = nil
	moved := f.Scope().VM
	want.State = ""
	if got := progressOf(moved); got != want {
		t.Errorf("after a move the VM lost its identity or placement (-want +got):\n%s", cmp.Diff(want, got))
	}
	if moved.State != "" || moved.BootstrapDataRemoved {
		t.Errorf("after a move the VM claims progress only status held")
	}
}

// TestLoadBalancerVMWrittenBack: the HAProxy VM's identity goes into the
// LibvirtCluster's annotations and status.loadBalancer.domain, comes back
// in the next reconcile's VM, and is gone from status once deleted.
func TestLoadBalancerVMWrittenBack(t *testing.T) {
	const uuid, mac = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "52:54:00:ab:cd:ef"
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: "pool", Path: "/pools/pool"}
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lc).WithStatusSubresource(&infrav1.LibvirtCluster{}).Build()
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(lc), lc); err != nil {
		t.Fatal(err)
	}
	newScope := func() *scope.ClusterScope {
		t.Helper()
		s, err := scope.NewClusterScope(scope.ClusterScopeParams{Client: c, LibvirtCluster: lc, Host: fakehost.New(), HostName: "host1"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	s := newScope()
	// The network step of the same reconcile reports the network first.
	lc.Status.Network = &infrav1.NetworkStatus{Name: "net"}
	vm := s.LoadBalancerVM()
	if vm.Network.Name != "net" || vm.Domain == "" || vm.Hostname != "c-lb" || vm.Provisioned {
		t.Fatalf("HAProxy VM %+v", vm)
	}
	vm.UUID, vm.MAC, vm.State = uuid, mac, "running"
	vm.RecordPlacement()
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored := &infrav1.LibvirtCluster{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(lc), stored); err != nil {
		t.Fatal(err)
	}
	if stored.Annotations[scope.LoadBalancerUUIDAnnotation] != uuid || stored.Annotations[scope.LoadBalancerMACAnnotation] != mac ||
		stored.Annotations[scope.PoolAnnotation] != "pool" {
		t.Errorf("annotations %v", stored.Annotations)
	}
	if lb := stored.Status.LoadBalancer; lb == nil || lb.Domain == nil || lb.Domain.MAC != mac || lb.Domain.State != "running" || lb.Domain.Host != "host1" {
		t.Errorf("status.loadBalancer %+v", lb)
	}
	want := progressOf(vm)
	if got := progressOf(newScope().LoadBalancerVM()); got != want {
		t.Errorf("next reconcile's HAProxy VM differs (-want +got):\n%s", cmp.Diff(want, got))
	}

	s = newScope()
	s.LoadBalancerVM()
	s.LoadBalancerDeleted()
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(lc), stored); err != nil {
		t.Fatal(err)
	}
	if stored.Status.LoadBalancer != nil {
		t.Errorf("status.loadBalancer %+v after the VM was deleted", stored.Status.LoadBalancer)
	}
}

// TestAddressingOf: the addressing mode every step reads, decided once
// from the network and the pools.
func TestAddressingOf(t *testing.T) {
	pools := []infrav1.IPPoolReference{{Kind: "InClusterIPPool", Name: "lan"}}
	for _, tc := range []struct {
		name    string
		network scope.NetworkRef
		pools   []infrav1.IPPoolReference
		want    scope.Addressing
	}{
		{name: "network not known yet", pools: pools, want: scope.AddressingUnknown},
		{name: "libvirt network", network: scope.NetworkRef{Name: "capl-ns.c"}, want: scope.AddressingReserved},
		{name: "host bridge", network: scope.NetworkRef{Bridge: "br0"}, want: scope.AddressingLAN},
		{name: "pools on a bridge", network: scope.NetworkRef{Bridge: "br0"}, pools: pools, want: scope.AddressingPool},
		{name: "pools on a libvirt network", network: scope.NetworkRef{Name: "lan"}, pools: pools, want: scope.AddressingPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := scope.AddressingOf(tc.network, tc.pools); got != tc.want {
				t.Errorf("AddressingOf = %q, want %q", got, tc.want)
			}
		})
	}
}
