package controllers_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// notStarted is the provider's libvirt host with StartDomain doing
// nothing: domains are defined, as the tests of shared segments need
// (libvirt holds their MACs and recorded addresses), and no guest boots.
type notStarted struct{ virt.Host }

func (notStarted) StartDomain(context.Context, string) error { return nil }

func definedOnly(h virt.Host) virt.Host { return notStarted{h} }

// tenant is a second namespace of the same plane and provider: another
// tenant's machines beside the harness's. Its machines are deleted when
// the test ends, while the provider still runs.
func (h *harness) tenant() *harness {
	h.t.Helper()
	o := &harness{t: h.t, ctx: h.ctx, env: h.env, c: h.c, uri: h.uri, image: h.image, imageSum: h.imageSum, host: h.host,
		pool: h.pool, poolPath: h.poolPath, network: h.network, ns: testlibvirt.Name(h.t), logs: h.logs, logPath: h.logPath}
	must(h.t, h.c.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.ns}}))
	h.t.Cleanup(func() {
		ctx := context.Background()
		machines := &clusterv1.MachineList{}
		if err := o.c.List(ctx, machines, client.InNamespace(o.ns)); err != nil {
			return
		}
		for i := range machines.Items {
			_ = o.c.Delete(ctx, &machines.Items[i])
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			left := &infrav1.LibvirtMachineList{}
			if err := o.c.List(ctx, left, client.InNamespace(o.ns)); err != nil || len(left.Items) == 0 {
				return
			}
			time.Sleep(time.Second)
		}
		h.t.Errorf("machines of namespace %s left after the test", o.ns)
	})
	return o
}

// fromPool attaches a machine to network or bridge with its address from
// testipam's pool.
func fromPool(network, bridge, pool string) *infrav1.NetworkAttachment {
	return &infrav1.NetworkAttachment{Name: network, Bridge: bridge,
		AddressesFromPools: []infrav1.IPPoolReference{{APIGroup: testipam.Group, Kind: testipam.Kind, Name: pool}}}
}

// grantPools has the provider allow testipam's pools and addresses in
// ranges.
func grantPools(o *manager.Options, ranges ...string) {
	o.PoolAddressCIDRs = ranges
	o.IPAMPools = []string{"*=" + testipam.Kind + "." + testipam.Group + "/*"}
}

// hostAddr is the address of p's subnet whose last octet is last.
func hostAddr(p netip.Prefix, last byte) netip.Addr {
	o := p.Addr().As4()
	o[3] = last
	return netip.AddrFrom4(o)
}

// assertNothingCreated fails when libvirt holds a domain or a volume of
// the named machine.
func (h *harness) assertNothingCreated(name string) {
	h.t.Helper()
	domain := naming.DomainName(h.ns, name)
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		h.t.Errorf("%s: domain %s exists (err %v)", name, domain, err)
	}
	for _, vol := range []string{naming.OverlayVolumeName(domain), naming.SeedVolumeName(domain), naming.ConsoleLogVolumeName(domain)} {
		if _, err := h.host.VolumeInfo(h.ctx, h.pool, vol); !virt.IsNotFound(err) {
			h.t.Errorf("%s: volume %s exists (err %v)", name, vol, err)
		}
	}
}

// TestPoolAddressesHeldOnTheSegment: a tenant's IPAM pool hands its
// machine an address somebody else holds on the shared segment, each
// refused (AddressReserved AddressInUse) before anything is created: the
// libvirt network's gateway, an address in its DHCP range, one another
// namespace's VM holds by a DHCP reservation, one another namespace's
// pool machine (its domain defined by the provider) holds, and the host
// bridge's own address. Domains are defined, never started.
//
// The reservation stands in for a lease: the check reads both from the
// same network listing (virt.SegmentUse's Reservations and Leases; the
// lease branch is TestSegmentHolders'). On the code before this test the
// first of these machines (the gateway) got AddressReserved True and a
// domain.
func TestPoolAddressesHeldOnTheSegment(t *testing.T) {
	h := newHarness(t)
	lan := testlibvirt.OperatorNetwork(t, h.uri, h.host, virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Cluster: "operator"}, h.cleanupMachines)
	bridgeNet := netip.MustParsePrefix("198.51.100.1/24")
	bridge := testlibvirt.HostBridge(t, bridgeNet)
	h.options = func(o *manager.Options) { grantPools(o, lan.CIDR.String(), bridgeNet.Masked().String()) }
	h.startProvider(definedOnly)
	victims := h.tenant()
	h.createCluster("thief", true)
	victims.createCluster("victims", true)

	ctx, cancel := context.WithCancel(h.ctx)
	t.Cleanup(cancel)
	r := func(a netip.Addr, bits int, gw netip.Addr) *testipam.Range {
		return &testipam.Range{Next: a, Bits: bits, Gateway: gw}
	}
	go (&testipam.Controller{Client: h.c, Namespace: victims.ns, Pools: map[string]*testipam.Range{
		"lan": r(hostAddr(lan.CIDR, 160), 24, lan.Gateway)}}).Run(ctx, t.Logf)
	go (&testipam.Controller{Client: h.c, Namespace: h.ns, Pools: map[string]*testipam.Range{
		"gateway":  r(lan.Gateway, 24, hostAddr(lan.CIDR, 254)), // the pool names another router
		"dhcp":     r(hostAddr(lan.CIDR, 50), 24, lan.Gateway),
		"reserved": r(hostAddr(lan.CIDR, 150), 24, lan.Gateway),
		"held":     r(hostAddr(lan.CIDR, 160), 24, lan.Gateway),
		"bridge":   r(bridgeNet.Addr(), 24, netip.MustParseAddr("198.51.100.254")),
	}}).Run(ctx, t.Logf)

	// Another tenant's VM holds .150 by its DHCP entry (named after it).
	victimMAC := netalloc.MAC("52:54:00:5e:9a:01")
	_, err := h.host.ReserveAddress(h.ctx, lan.Name, virt.Reservation{MAC: victimMAC, IP: hostAddr(lan.CIDR, 150),
		Owner: &virt.Owner{Kind: "LibvirtMachine", Namespace: victims.ns, Name: "dhcp-victim"}})
	must(t, err)
	t.Cleanup(func() { _ = h.host.ReleaseAddress(context.Background(), lan.Name, victimMAC) })
	// Another tenant's pool machine holds .160: its domain is defined.
	victims.createMachine("pool-victim", machineOpts{cluster: "victims", withData: true, network: fromPool(lan.Name, "", "lan")})
	victims.waitCondition("pool-victim", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)

	for _, tc := range []struct {
		name, network, bridge, pool, want string
	}{
		{"gateway", lan.Name, "", "gateway", "own address"},
		{"dhcp", lan.Name, "", "dhcp", "DHCP range"},
		{"reserved", lan.Name, "", "reserved", "reserved in the network's DHCP server for MAC " + victimMAC.String()},
		{"held", lan.Name, "", "held", "held by another VM"},
		{"bridge", "", bridge, "bridge", "own address"},
	} {
		h.createMachine(tc.name, machineOpts{cluster: "thief", withData: true, network: fromPool(tc.network, tc.bridge, tc.pool)})
		lm := h.waitCondition(tc.name, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.AddressInUseReason, 2*time.Minute)
		msg := conditions.Get(lm, infrav1.AddressReservedCondition).Message
		t.Logf("%s: %s", tc.name, msg)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: AddressReserved %q, want it to say %q", tc.name, msg, tc.want)
		}
		h.assertNothingCreated(tc.name)
	}
}

// TestClaimKeptWhileTheDomainExists: a pool machine's IPAddressClaim
// deleted under its defined domain (the pool then hands its address to
// someone else) is made again, and the other address the pool gives the
// new claim is refused (AddressReserved IPAddressChanged): the domain
// keeps the address it was defined with. Another namespace's machine then
// handed that released address is refused (AddressInUse): held addresses
// are counted from libvirt, not from claims. Domains are defined, never
// started.
//
// On the code before this test the domain recorded no address and the
// machine took the new one (AddressReserved True).
func TestClaimKeptWhileTheDomainExists(t *testing.T) {
	h := newHarness(t)
	lan := testlibvirt.OperatorNetwork(t, h.uri, h.host, virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Cluster: "operator"}, h.cleanupMachines)
	h.options = func(o *manager.Options) { grantPools(o, lan.CIDR.String()) }
	h.startProvider(definedOnly)
	other := h.tenant()
	h.createCluster("keep", true)
	other.createCluster("other", true)
	ctx, cancel := context.WithCancel(h.ctx)
	t.Cleanup(cancel)
	held := hostAddr(lan.CIDR, 170)
	go (&testipam.Controller{Client: h.c, Namespace: h.ns, Pools: map[string]*testipam.Range{
		"lan": {Next: held, Bits: 24, Gateway: lan.Gateway}}}).Run(ctx, t.Logf)
	go (&testipam.Controller{Client: h.c, Namespace: other.ns, Pools: map[string]*testipam.Range{
		"lan": {Next: held, Bits: 24, Gateway: lan.Gateway}}}).Run(ctx, t.Logf)

	h.createMachine("keeper", machineOpts{cluster: "keep", withData: true, network: fromPool(lan.Name, "", "lan")})
	h.waitCondition("keeper", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)
	info, err := h.host.DomainInfo(h.ctx, naming.DomainName(h.ns, "keeper"))
	must(t, err)
	if len(info.StaticAddresses) != 1 || info.StaticAddresses[0] != held {
		t.Errorf("the domain records %v, want %s", info.StaticAddresses, held)
	}

	// The tenant deletes the claim (its IPAddress first, as a pool that
	// releases it would): the pool's next answer is another address.
	claimName := naming.IPAddressClaimName("keeper", 0)
	must(t, client.IgnoreNotFound(h.c.Delete(h.ctx, &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: claimName}})))
	claim := &ipamv1.IPAddressClaim{}
	must(t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, claim))
	must(t, h.c.Delete(h.ctx, claim))
	lm := h.waitCondition("keeper", infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.IPAddressChangedReason, 2*time.Minute)
	t.Logf("keeper: %s", conditions.Get(lm, infrav1.AddressReservedCondition).Message)
	again := &ipamv1.IPAddressClaim{}
	must(t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, again))
	if again.UID == claim.UID {
		t.Errorf("claim %s was not made again", claimName)
	}
	if info, err := h.host.DomainInfo(h.ctx, naming.DomainName(h.ns, "keeper")); err != nil || len(info.StaticAddresses) != 1 || info.StaticAddresses[0] != held {
		t.Errorf("the domain records %v (err %v) after the claim changed, want %s", info.StaticAddresses, err, held)
	}

	// The other namespace's pool hands out the released address.
	other.createMachine("taker", machineOpts{cluster: "other", withData: true, network: fromPool(lan.Name, "", "lan")})
	lm = other.waitCondition("taker", infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.AddressInUseReason, 2*time.Minute)
	t.Logf("taker: %s", conditions.Get(lm, infrav1.AddressReservedCondition).Message)
	other.assertNothingCreated("taker")

	h.deleteMachine("keeper", 2*time.Minute)
	h.waitFor("claim "+claimName+" released", time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: claimName}, &ipamv1.IPAddressClaim{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// testForgedMACOnSharedSegments: another namespace's machine on a pool
// address of the operator's libvirt network, and another on a host
// bridge, have their domains defined; a machine of this namespace created
// with either's MAC in its annotation, or with a MAC no domain uses (the
// LAN router's, read from ARP), is refused (AddressReserved MACNotOwned)
// and nothing is created for it. Neither segment makes a DHCP entry, so
// the entry's owner check of the DHCP case never runs there.
func testForgedMACOnSharedSegments(h *harness) {
	t := h.t
	lan := testlibvirt.OperatorNetwork(t, h.uri, h.host, virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Cluster: "operator"}, h.cleanupMachines)
	bridge := testlibvirt.HostBridge(t, netip.Prefix{})
	victims := h.tenant()
	victims.createCluster("victims", true)
	ctx, cancel := context.WithCancel(h.ctx)
	t.Cleanup(cancel)
	pool := map[string]*testipam.Range{"lan": {Next: hostAddr(lan.CIDR, 180), Bits: 24, Gateway: lan.Gateway}}
	go (&testipam.Controller{Client: h.c, Namespace: victims.ns, Pools: pool}).Run(ctx, t.Logf)
	go (&testipam.Controller{Client: h.c, Namespace: h.ns, Pools: map[string]*testipam.Range{
		"lan": {Next: hostAddr(lan.CIDR, 190), Bits: 24, Gateway: lan.Gateway}}}).Run(ctx, t.Logf)

	victims.createMachine("on-pool", machineOpts{cluster: "victims", withData: true, network: fromPool(lan.Name, "", "lan")})
	victims.createMachine("on-bridge", machineOpts{cluster: "victims", withData: true, network: &infrav1.NetworkAttachment{Bridge: bridge}})
	var poolMAC, bridgeMAC string
	for name, mac := range map[string]*string{"on-pool": &poolMAC, "on-bridge": &bridgeMAC} {
		lm := victims.waitCondition(name, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)
		if *mac = lm.Annotations[scope.MACAnnotation]; *mac == "" {
			t.Fatalf("%s recorded no MAC", name)
		}
	}
	router := "02:00:5e:10:00:01"
	for _, tc := range []struct {
		name, mac string
		network   *infrav1.NetworkAttachment
	}{
		{"pool-thief", poolMAC, fromPool(lan.Name, "", "lan")},
		{"bridge-thief", bridgeMAC, &infrav1.NetworkAttachment{Bridge: bridge}},
		{"router-thief", router, &infrav1.NetworkAttachment{Bridge: bridge}},
	} {
		h.createMachine(tc.name, machineOpts{cluster: "shared", withData: true, network: tc.network,
			annotations: map[string]string{scope.MACAnnotation: tc.mac}})
		lm := h.waitCondition(tc.name, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.MACNotOwnedReason, 2*time.Minute)
		msg := conditions.Get(lm, infrav1.AddressReservedCondition).Message
		t.Logf("%s: %s", tc.name, msg)
		if !strings.Contains(msg, tc.mac) {
			t.Errorf("%s: AddressReserved %q does not name the MAC %s", tc.name, msg, tc.mac)
		}
		h.assertNothingCreated(tc.name)
		h.deleteMachine(tc.name, 2*time.Minute)
	}
}
