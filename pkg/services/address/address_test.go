package address_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestAddressPersistsMACBeforeReserving(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	s.VM.UUID = "0b9d6c86-1111-4e2e-9c55-3b6f1b0d7a11"
	first := naming.MACCandidates(s.VM.UUID, 2)
	// Someone else's entry holds the first candidate.
	f.Host.Entries["net"] = []virt.Reservation{{MAC: netalloc.MAC(strings.ToUpper(first[0].String())), IP: netip.MustParseAddr("192.168.100.2")}}
	f.Host.OnCall = func(method string) {
		if method == "ReserveAddress" && f.Stored().Status.Domain == nil {
			t.Error("ReserveAddress ran before the MAC was persisted")
		}
	}
	if err := servicetest.Reconcile(s, infrav1.AddressReservedCondition, address.New(s.VM, s.Host)); err != nil {
		t.Fatal(err)
	}
	if s.VM.MAC != first[1] {
		t.Errorf("MAC = %s, want the second candidate %s", s.VM.MAC, first[1])
	}
	stored := f.Stored()
	if stored.Annotations[scope.PoolAnnotation] != "pool" || stored.Annotations[scope.NetworkAnnotation] != "network:net" {
		t.Errorf("placement not recorded: %v", stored.Annotations)
	}
	servicetest.WantCondition(t, f.LM, infrav1.AddressReservedCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	// Idempotent: a second run keeps the MAC and the one entry.
	fs := f.Scope()
	fs.VM.UUID = s.VM.UUID // the identity step's, from spec.providerID
	if err := servicetest.Reconcile(fs, infrav1.AddressReservedCondition, address.New(fs.VM, fs.Host)); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Host.Entries["net"]); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	fs = f.Scope()
	if err := address.New(fs.VM, fs.Host).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Host.Entries["net"]); n != 1 {
		t.Errorf("after delete %d entries, want only the foreign one", n)
	}
}

func TestAddressWaitsForNetworkAndHandlesBridges(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.LC.Status.Network = nil
	fs := f.Scope()
	err := servicetest.Reconcile(fs, infrav1.AddressReservedCondition, address.New(fs.VM, fs.Host))
	if rq, ok := services.AsRequeue(err); !ok || rq.After == 0 {
		t.Fatalf("err = %v, want a timed requeue", err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.WaitingForNetworkReason)

	f.LM.Spec.Network = &infrav1.NetworkAttachment{Bridge: "br0"}
	fs = f.Scope()
	if err := servicetest.Reconcile(fs, infrav1.AddressReservedCondition, address.New(fs.VM, fs.Host)); err != nil {
		t.Fatal(err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.AddressReservedCondition, metav1.ConditionTrue, infrav1.ReservationNotSupportedReason)
	if f.Host.Called("ReserveAddress") {
		t.Error("reserved on a bridge")
	}
}

func TestAddressConflict(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.Host.Errs["ReserveAddress"] = &virt.AddressConflictError{Network: "net", Reason: virt.ConflictLeased, HeldBy: "52:54:00:00:00:01", Until: time.Now().Add(time.Minute)}
	fs := f.Scope()
	err := servicetest.Reconcile(fs, infrav1.AddressReservedCondition, address.New(fs.VM, fs.Host))
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want a requeue until the lease expires", err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.AddressConflictReason)
}

// TestAddressRefusesMACsNotItsOwn: a MAC in the annotation that the
// provider did not derive from the domain UUID is refused unless the VM's
// own domain uses it; a derived one another owner's domain on the segment
// uses is refused too; nothing is reserved for either.
func TestAddressRefusesMACsNotItsOwn(t *testing.T) {
	const uuid = "0b9d6c86-1111-4e2e-9c55-3b6f1b0d7a11"
	forged := netalloc.MAC("02:11:22:33:44:55")
	for _, tc := range []struct {
		name   string
		mac    netalloc.MAC
		domain func(f *servicetest.Fixture, vm *scope.VM) // defines a domain on the segment
		ok     bool
	}{
		{name: "forged, no domain", mac: forged},
		{name: "forged, another object's domain uses it", mac: forged, domain: func(f *servicetest.Fixture, vm *scope.VM) {
			f.Host.Specs["victim"] = virt.DomainSpec{Name: "victim", Network: "net", MAC: forged, Owner: virt.Owner{Kind: "LibvirtMachine", Namespace: "other", Name: "victim"}}
		}},
		{name: "forged, the VM's own domain uses it", mac: forged, ok: true, domain: func(f *servicetest.Fixture, vm *scope.VM) {
			f.Host.Specs[vm.Domain] = virt.DomainSpec{Name: vm.Domain, Network: "net", MAC: forged, Owner: vm.Owner}
		}},
		{name: "derived, another object's domain uses it", mac: naming.MACCandidates(uuid, 1)[0], domain: func(f *servicetest.Fixture, vm *scope.VM) {
			f.Host.Specs["victim"] = virt.DomainSpec{Name: "victim", Network: "net", MAC: naming.MACCandidates(uuid, 1)[0], Owner: virt.Owner{Kind: "LibvirtCluster", Namespace: "other", Name: "victim"}}
		}},
		{name: "derived", mac: naming.MACCandidates(uuid, 1)[0], ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s := f.Scope()
			s.VM.UUID, s.VM.MAC = uuid, tc.mac
			if tc.domain != nil {
				tc.domain(f, s.VM)
			}
			err := servicetest.Reconcile(s, infrav1.AddressReservedCondition, address.New(s.VM, s.Host))
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			servicetest.WantCondition(t, f.LM, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.MACNotOwnedReason)
			if f.Host.Called("ReserveAddress") {
				t.Error("reserved an address for a MAC not the VM's")
			}
		})
	}
}
