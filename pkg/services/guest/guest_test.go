package guest_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

type leaseRecorder struct{ watched []string }

func (l *leaseRecorder) WatchLease(_ virt.NetworkHost, network string, mac netalloc.MAC) {
	l.watched = append(l.watched, network+"/"+mac.String())
}

func TestGuestAddressesNeedALease(t *testing.T) {
	f := servicetest.NewFixture(t)
	s, _ := servicetest.Provision(t, f)
	leases := &leaseRecorder{}
	g := guest.NewAddresses(s.VM, s.Host, leases)
	err := servicetest.Reconcile(s, infrav1.AddressAssignedCondition, g)
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want to wait for a lease", err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.AddressAssignedCondition, metav1.ConditionFalse, infrav1.WaitingForAddressReason)
	if len(leases.watched) != 1 || leases.watched[0] != "net/"+s.VM.MAC.String() {
		t.Errorf("lease watches = %v", leases.watched)
	}
	f.Host.Leases["net"] = map[string]netip.Addr{strings.ToUpper(s.VM.MAC.String()): netip.MustParseAddr("192.168.100.2")}
	if err := servicetest.Reconcile(s, infrav1.AddressAssignedCondition, g); err != nil {
		t.Fatal(err)
	}
	// The write-back puts the VM's addresses into status.
	if err := s.PatchObject(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: "192.168.100.2"}, {Type: clusterv1.MachineHostName, Address: "m0"}}
	if fmt.Sprint(f.LM.Status.Addresses) != fmt.Sprint(want) {
		t.Errorf("addresses = %v, want %v", f.LM.Status.Addresses, want)
	}
}

// TestGuestAddressesOfAPoolAddressFromTheAgent: a guest with addresses
// from IPAM pools is asked through its agent (a network of the fake host
// named "" stands for it), never for a DHCP lease, which a stale entry of
// its MAC could still offer.
func TestGuestAddressesOfAPoolAddressFromTheAgent(t *testing.T) {
	f := servicetest.NewFixture(t)
	s, _ := servicetest.Provision(t, f)
	s.VM.AddressPools = []infrav1.IPPoolReference{{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}}
	s.VM.Addressing = scope.AddressingOf(s.VM.Network, s.VM.AddressPools)
	leases := &leaseRecorder{}
	g := guest.NewAddresses(s.VM, s.Host, leases)
	mac := strings.ToUpper(s.VM.MAC.String())
	f.Host.Leases["net"] = map[string]netip.Addr{mac: netip.MustParseAddr("192.168.100.2")}
	err := servicetest.Reconcile(s, infrav1.AddressAssignedCondition, g)
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want to wait for the agent", err)
	}
	if len(leases.watched) != 0 {
		t.Errorf("lease watches = %v, want none", leases.watched)
	}
	f.Host.Leases[""] = map[string]netip.Addr{mac: netip.MustParseAddr("192.168.100.250")}
	if err := servicetest.Reconcile(s, infrav1.AddressAssignedCondition, g); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.VM.Addresses) != "[192.168.100.250]" {
		t.Errorf("addresses = %v, want the agent's 192.168.100.250 only", s.VM.Addresses)
	}
}

func TestGuestBootstrapSentinel(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	g := guest.NewBootstrap(s.VM, s.Host, neverBefore)
	err := servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, g)
	if rq, ok := services.AsRequeue(err); !ok || rq.After < 10*time.Second {
		t.Fatalf("err = %v, want a requeue with backoff", err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.BootstrapSucceededCondition, metav1.ConditionFalse, infrav1.WaitingForBootstrapReason)

	f.Host.Files[s.VM.Domain+":/run/cloud-init/result.json"] = []byte(`{"v1": {"errors": ["runcmd failed: ` + servicetest.SecretMarker + `"]}}`)
	_ = servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, g)
	c := servicetest.WantCondition(t, f.LM, infrav1.BootstrapSucceededCondition, metav1.ConditionFalse, infrav1.BootstrapFailedReason)
	if !strings.Contains(c.Message, "1 errors") || !strings.Contains(c.Message, "went down before it ended") {
		t.Errorf("message %q", c.Message)
	}

	f.Host.Files[s.VM.Domain+":"+guest.SentinelPath] = []byte("success\n")
	if err := servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, g); err != nil {
		t.Fatal(err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.BootstrapSucceededCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	if !g.Succeeded() {
		t.Error("the success is not handed to the removal step")
	}
	f.NoLeaks()

	// The removal step after it empties the seed: the check is done.
	s.VM.BootstrapDataRemoved = true
	f.Host.Errs["GuestReadFile"] = errors.New("must not be called again")
	if err := servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, g); err != nil {
		t.Errorf("sentinel re-read after success: %v", err)
	}
}

// neverBefore is a machine whose bootstrap never succeeded before.
func neverBefore(context.Context) (bool, error) { return false, nil }

// TestGuestBootstrapAfterReboot: a guest rebooted after its bootstrap has
// no sentinel (a seed without the sentinel vendor-data leaves it in /run
// only) and a finished cloud-init; whether that is
// a failure depends on whether the bootstrap succeeded at an earlier boot,
// which the status may no longer say (clusterctl move, a restore).
func TestGuestBootstrapAfterReboot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		once   guest.SucceededOnce
		status metav1.ConditionStatus
		reason string
	}{
		{"succeeded before", func(context.Context) (bool, error) { return true, nil }, metav1.ConditionTrue, infrav1.ReadyReason},
		{"never succeeded", neverBefore, metav1.ConditionFalse, infrav1.BootstrapFailedReason},
		{"seed unreadable", func(context.Context) (bool, error) { return false, errors.New("libvirtd gone") }, metav1.ConditionFalse, infrav1.LibvirtErrorReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s := f.Scope()
			f.Host.Files[s.VM.Domain+":/run/cloud-init/result.json"] = []byte(`{"v1": {"errors": []}}`)
			_ = servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, guest.NewBootstrap(s.VM, s.Host, tc.once))
			servicetest.WantCondition(t, f.LM, infrav1.BootstrapSucceededCondition, tc.status, tc.reason)
		})
	}
}

// TestGuestBootstrapSentinelShownDuringTheCheck: after a reboot the
// sentinel kept on the disk shows only once a per-boot script linked
// /run/cluster-api, which may happen between the check's read of the
// sentinel and its read of cloud-init's result; a finished cloud-init
// with the sentinel there is a success, not BootstrapFailed.
func TestGuestBootstrapSentinelShownDuringTheCheck(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	reads := 0
	f.Host.OnCall = func(method string) {
		if method != "GuestReadFile" {
			return
		}
		if reads++; reads == 2 { // the result's read: the link is there by now
			f.Host.Files[s.VM.Domain+":/run/cloud-init/result.json"] = []byte(`{"v1": {"errors": []}}`)
			f.Host.Files[s.VM.Domain+":"+guest.SentinelPath] = []byte("success\n")
		}
	}
	if err := servicetest.Reconcile(s, infrav1.BootstrapSucceededCondition, guest.NewBootstrap(s.VM, s.Host, neverBefore)); err != nil {
		t.Fatal(err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.BootstrapSucceededCondition, metav1.ConditionTrue, infrav1.ReadyReason)
}
