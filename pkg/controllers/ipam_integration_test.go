package controllers_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testipam"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestMachineAddressFromPool boots a machine whose address comes from a
// Cluster API IPAM pool, on a libvirt network the operator made (the
// harness's), with the operator's traffic filter on its NIC. Before the
// pool answers, the machine waits (AddressReserved WaitingForIPAddress)
// with its claim made and nothing in libvirt; once it answers, the guest
// holds the address with the pool's prefix, uses the machine's
// nameserver, serves on the address through the filter, and reports it in
// status.addresses. An address outside the operator's
// --pool-address-cidrs is refused before anything is created. Deleting
// the machines releases their claims.
//
// The IPAM provider is testipam's, a minimal pool controller of the tests:
// the in-cluster IPAM provider's module is not served on this machine.
func TestMachineAddressFromPool(t *testing.T) {
	h := newHarness(t)
	// The operator's network, whose DHCP server leaves .100 and up to
	// the pools.
	op := testlibvirt.OperatorNetwork(t, h.uri, h.host, virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Cluster: "operator"}, h.cleanupMachines)
	lan := op.CIDR
	address := hostAddr(lan, 250)
	far := netip.MustParsePrefix("203.0.113.0/24")
	h.options = func(o *manager.Options) {
		o.TrafficFilter = virt.CleanTrafficFilter
		grantPools(o, lan.String())
	}
	h.startProvider(nil)
	const cluster = "ipam"
	h.createCluster(cluster, true)

	lanPool := infrav1.IPPoolReference{APIGroup: testipam.Group, Kind: testipam.Kind, Name: "lan"}
	farPool := infrav1.IPPoolReference{APIGroup: testipam.Group, Kind: testipam.Kind, Name: "far"}
	nameserver := op.Gateway.String()
	h.createMachine("ipam-0", machineOpts{cluster: cluster, withData: true, userData: readyzUserData,
		network: &infrav1.NetworkAttachment{Name: op.Name, AddressesFromPools: []infrav1.IPPoolReference{lanPool}, Nameservers: []string{nameserver}}})

	// No pool answers yet: the machine waits with its claim made, and
	// libvirt holds nothing of it.
	lm := h.waitCondition("ipam-0", infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.WaitingForIPAddressReason, 2*time.Minute)
	t.Logf("waiting: %s", conditions.Get(lm, infrav1.AddressReservedCondition).Message)
	claimName := naming.IPAddressClaimName("ipam-0", 0)
	claim := &ipamv1.IPAddressClaim{}
	must(t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, claim))
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "LibvirtMachine" || ref.Name != "ipam-0" || ref.UID != lm.UID {
		t.Errorf("claim %s's controller: %+v; want LibvirtMachine ipam-0", claimName, ref)
	}
	if claim.Labels[clusterv1.ClusterNameLabel] != cluster || claim.Spec.ClusterName != cluster ||
		claim.Spec.PoolRef != (ipamv1.IPPoolReference{APIGroup: testipam.Group, Kind: testipam.Kind, Name: "lan"}) {
		t.Errorf("claim %s: labels %v, spec %+v", claimName, claim.Labels, claim.Spec)
	}
	domain := naming.DomainName(h.ns, "ipam-0")
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		t.Errorf("domain %s exists before its address was known (%v)", domain, err)
	}

	// The pool answers: the machine boots with its address.
	ctx, cancel := context.WithCancel(h.ctx)
	t.Cleanup(cancel)
	pools := &testipam.Controller{Client: h.c, Namespace: h.ns, Pools: map[string]*testipam.Range{
		"lan": {Next: address, Bits: lan.Bits(), Gateway: op.Gateway},
		"far": {Next: netip.MustParseAddr("203.0.113.10"), Bits: far.Bits(), Gateway: netip.MustParseAddr("203.0.113.1")},
	}}
	go pools.Run(ctx, t.Logf)
	start := time.Now()
	lm = h.waitAddress("ipam-0", 8*time.Minute)
	t.Logf("FIGURE machine with a pool address: claim fulfilled → address reported %s", time.Since(start).Round(time.Second))
	if got := internalIP(lm); got != address.String() {
		t.Errorf("status.addresses %v; want %s first", lm.Status.Addresses, address)
	}
	want := netip.PrefixFrom(address, lan.Bits()).String()
	if c := conditions.Get(lm, infrav1.AddressReservedCondition); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, want) {
		t.Errorf("AddressReserved %+v; want True naming %s", c, want)
	}

	// The guest's own view: the address with the pool's prefix, no DHCP
	// lease, the machine's nameserver.
	res, err := h.host.GuestExec(ctx, domain, "ip", []string{"-4", "-o", "addr", "show", "scope", "global"}, nil)
	must(t, err)
	if !strings.Contains(string(res.Stdout), " "+want+" ") {
		t.Errorf("the guest's addresses:\n%s\nwant %s", res.Stdout, want)
	}
	if n := strings.Count(string(res.Stdout), " inet "); n != 1 {
		t.Errorf("the guest holds %d IPv4 addresses (a DHCP lease besides the pool's?):\n%s", n, res.Stdout)
	}
	resolv, err := h.host.GuestReadFile(ctx, domain, "/etc/resolv.conf")
	must(t, err)
	if !strings.Contains(string(resolv), "nameserver "+nameserver) {
		t.Errorf("the guest's resolv.conf:\n%s\nwant nameserver %s", resolv, nameserver)
	}

	// Through the traffic filter: it holds the address as the guest's,
	// and the guest serves on it.
	out, err := exec.Command("virsh", "-c", h.uri, "dumpxml", domain).CombinedOutput()
	must(t, err)
	if !strings.Contains(string(out), fmt.Sprintf("<parameter name='IP' value='%s'/>", address)) {
		t.Errorf("the domain's traffic filter does not hold %s:\n%s", address, out)
	}
	endpoint := net.JoinHostPort(address.String(), "6443")
	h.waitFor("the guest serving on "+endpoint, 3*time.Minute, func() (bool, string) {
		body, err := readyz(endpoint)
		return err == nil && strings.TrimSpace(body) == "ipam-0", fmt.Sprintf("%q %v", body, err)
	})

	// An address outside --pool-address-cidrs: refused, nothing created.
	h.createMachine("ipam-far", machineOpts{cluster: cluster, withData: true,
		network: &infrav1.NetworkAttachment{Name: op.Name, AddressesFromPools: []infrav1.IPPoolReference{farPool}}})
	lm = h.waitCondition("ipam-far", infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.IPAddressInvalidReason, 2*time.Minute)
	if msg := conditions.Get(lm, infrav1.AddressReservedCondition).Message; !strings.Contains(msg, "--pool-address-cidrs") {
		t.Errorf("IPAddressInvalid message %q does not name the operator's flag", msg)
	}
	if _, err := h.host.DomainInfo(h.ctx, naming.DomainName(h.ns, "ipam-far")); !virt.IsNotFound(err) {
		t.Errorf("the refused machine's domain exists (%v)", err)
	}

	// Deletion releases the claims.
	for _, m := range []string{"ipam-0", "ipam-far"} {
		h.deleteMachine(m, 3*time.Minute)
		name := naming.IPAddressClaimName(m, 0)
		h.waitFor("claim "+name+" released", time.Minute, func() (bool, string) {
			err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &ipamv1.IPAddressClaim{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}
}

// TestLoadBalancerAddressFromPool runs a cluster's HAProxy VM whose
// address, the control-plane endpoint, comes from an IPAM pool, on a
// libvirt network the operator made, with the operator's traffic filter.
// Before the pool answers the cluster waits with its claim made and no VM;
// then the endpoint is the pool's address, the VM holds it alone (no DHCP
// reservation), the filter is pinned to it and HAProxy serves on it.
// Deleting the cluster releases the claim and leaves nothing in libvirt.
// The manager runs with --pool-address-cidrs naming the network's range
// and --ipam-pools granting the test's pool kind, as an operator's would
// (neither allows any pool address by default).
func TestLoadBalancerAddressFromPool(t *testing.T) {
	h := newClusterHarness(t)
	lan := testlibvirt.OperatorNetwork(t, h.uri, h.host, virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Cluster: "operator"}, h.cleanup)
	netName := lan.Name
	h.options = func(o *manager.Options) {
		o.TrafficFilter = virt.CleanTrafficFilter
		grantPools(o, lan.CIDR.String())
	}
	h.startProvider(nil)
	endpoint := hostAddr(lan.CIDR, 240)

	const name = "lbpool"
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}}}
	lc.Spec.Network.Name = netName
	lc.Spec.StoragePool = infrav1.StoragePool{Name: h.pool, Path: h.poolPath}
	lc.Spec.LoadBalancer = infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, VirtualHardware: tcgHardware(),
		Image:           &infrav1.ImageSource{URL: "file://" + h.lbImage, Checksum: "sha256:" + h.lbImageSum},
		AddressFromPool: &infrav1.IPPoolReference{APIGroup: testipam.Group, Kind: testipam.Kind, Name: "lan"}}
	must(t, h.c.Create(h.ctx, lc))
	h.createOwner(name, false)

	// No pool answers yet: the cluster waits, its claim made, no VM.
	lc = h.waitClusterCondition(name, infrav1.LoadBalancerReadyCondition, metav1.ConditionFalse, infrav1.WaitingForIPAddressReason, 3*time.Minute)
	claimName := naming.LoadBalancerIPAddressClaimName(name)
	claim := &ipamv1.IPAddressClaim{}
	must(t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, claim))
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "LibvirtCluster" || ref.Name != name {
		t.Errorf("claim %s's controller: %+v; want LibvirtCluster %s", claimName, ref, name)
	}
	domain := naming.LoadBalancerDomainName(h.ns, name)
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		t.Errorf("the HAProxy VM exists before its address was known (%v)", err)
	}
	if lc.Spec.ControlPlaneEndpoint.Host != "" {
		t.Errorf("endpoint %+v set before the pool answered", lc.Spec.ControlPlaneEndpoint)
	}

	ctx, cancel := context.WithCancel(h.ctx)
	t.Cleanup(cancel)
	pools := &testipam.Controller{Client: h.c, Namespace: h.ns, Pools: map[string]*testipam.Range{"lan": {Next: endpoint, Bits: lan.CIDR.Bits(), Gateway: lan.Gateway}}}
	go pools.Run(ctx, t.Logf)
	start := time.Now()
	lc = h.waitClusterCondition(name, infrav1.LoadBalancerReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 8*time.Minute)
	t.Logf("FIGURE HAProxy VM on a pool address serving: %s after the pool answered", time.Since(start).Round(time.Second))
	if lc.Spec.ControlPlaneEndpoint.Host != endpoint.String() || lc.Status.LoadBalancer == nil || lc.Status.LoadBalancer.Address != endpoint.String() {
		t.Errorf("endpoint %+v, load balancer %+v; want %s", lc.Spec.ControlPlaneEndpoint, lc.Status.LoadBalancer, endpoint)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(endpoint.String(), "6443"), 5*time.Second)
	must(t, err)
	_ = conn.Close()
	// The VM holds the pool's address alone: no DHCP reservation, a
	// filter pinned to it, and the guest's only IPv4 address.
	entries, err := h.host.Reservations(h.ctx, netName)
	must(t, err)
	for _, e := range entries {
		if e.MAC.Canonical() == netalloc.MAC(lc.Status.LoadBalancer.Domain.MAC).Canonical() {
			t.Errorf("a DHCP reservation for the HAProxy VM: %+v", e)
		}
	}
	out, err := exec.Command("virsh", "-c", h.uri, "dumpxml", domain).CombinedOutput()
	must(t, err)
	if !strings.Contains(string(out), fmt.Sprintf("<parameter name='IP' value='%s'/>", endpoint)) {
		t.Errorf("the HAProxy VM's traffic filter does not hold %s:\n%s", endpoint, out)
	}
	res, err := h.host.GuestExec(ctx, domain, "ip", []string{"-4", "-o", "addr", "show", "scope", "global"}, nil)
	must(t, err)
	if want := netip.PrefixFrom(endpoint, lan.CIDR.Bits()).String(); strings.Count(string(res.Stdout), " inet ") != 1 || !strings.Contains(string(res.Stdout), " "+want+" ") {
		t.Errorf("the HAProxy VM's addresses:\n%s\nwant %s alone", res.Stdout, want)
	}

	h.deleteAndWait(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}, 4*time.Minute)
	h.waitFor("the LibvirtCluster to go and its claim to be released", 2*time.Minute, func() (bool, string) {
		errLC := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &infrav1.LibvirtCluster{})
		errClaim := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, &ipamv1.IPAddressClaim{})
		return apierrors.IsNotFound(errLC) && apierrors.IsNotFound(errClaim), fmt.Sprintf("LibvirtCluster: %v, claim: %v", errLC, errClaim)
	})
}
