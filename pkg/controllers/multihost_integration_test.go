package controllers_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// lanPrefix is the testbed's LAN (hack/testbed-hosts.sh).
var lanPrefix = netip.MustParsePrefix("10.231.0.0/24")

// TestMultiHost places one cluster's machines on two real libvirt hosts
// sharing a LAN through their bridges, one over TCP, the other over TLS
// with a credentialsRef: each machine runs on the host of
// its failure domain with an address from the LAN's DHCP server read
// through the guest agent; a host whose libvirtd stops marks its machine
// HostUnreachable while the other host's machines go on; the machine
// recovers, without being recreated, when libvirtd is back; a host that
// drops off the network is noticed by keepalive; and a machine deleted
// while its host is away is removed once the host returns. A machine
// whose host device neither host has is placed on neither.
func TestMultiHost(t *testing.T) {
	testlibvirt.URI(t)
	tb := testlibvirt.StartTestbed(t, "a", "b")
	// Host b is reached over TLS with a credentialsRef Secret (client
	// certificate, key and CA); the test itself looks at it over TCP.
	uriA, uriB := tb.URI("a"), tb.TLSURI("b")
	h := newHarness(t)
	h.options = func(o *manager.Options) {
		o.LibvirtURIs = []string{uriA, uriB}
		o.HostDevices = []string{"gpu0=0000:fe:1f.7/nvidia.com/gpu"} // on neither host
	}
	h.startProvider(nil)
	cert, key, ca := tb.TLSCredentials()
	must(t, h.c.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "capl-host-b"},
		Data: map[string][]byte{hosts.TLSCertKey: cert, hosts.TLSKeyKey: key, hosts.CACertKey: ca}}))

	const cluster = "mh"
	const pool = "capl-mh"
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: cluster,
		Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}}}
	lc.Spec.Network.Bridge = "br0"
	lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "10.231.0.240", Port: 6443}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: pool, Path: "/var/lib/libvirt/" + pool}
	lc.Spec.FailureDomains = []infrav1.FailureDomainSpec{
		{Name: "host-a", URI: uriA, ControlPlane: ptr.To(true)},
		{Name: "host-b", URI: uriB, CredentialsRef: &infrav1.SecretReference{Name: "capl-host-b"}},
	}
	must(t, h.c.Create(h.ctx, lc))
	c := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: cluster}}
	c.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: cluster}
	must(t, h.c.Create(h.ctx, c))
	// The LibvirtCluster controller provisions the cluster: the bridge on
	// host a (the first control-plane failure domain), the user's endpoint.
	h.waitFor("LibvirtCluster "+cluster+" provisioned", 3*time.Minute, func() (bool, string) {
		must(t, h.c.Get(h.ctx, client.ObjectKeyFromObject(lc), lc))
		return lc.Status.Initialization.IsProvisioned() && lc.Status.Network != nil && lc.Status.Network.Bridge == "br0",
			fmt.Sprintf("network %+v, conditions %v", lc.Status.Network, lc.Status.Conditions)
	})

	hostA, hostB := testlibvirt.Client(t, uriA), testlibvirt.Client(t, tb.URI("b"))
	start := time.Now()
	h.createMachine("mh-a", machineOpts{cluster: cluster, withData: true, userData: bootUserData(), failureDomain: "host-a"})
	h.createMachine("mh-b", machineOpts{cluster: cluster, withData: true, userData: bootUserData(), failureDomain: "host-b"})
	for _, m := range []struct{ name, fd, addr string }{{"mh-a", "host-a", "10.231.0.11"}, {"mh-b", "host-b", "10.231.0.12"}} {
		lm := h.waitAddress(m.name, 6*time.Minute)
		if lm.Spec.FailureDomain != m.fd || lm.Status.FailureDomain != m.fd {
			t.Errorf("%s: spec.failureDomain %q, status.failureDomain %q; want %q", m.name, lm.Spec.FailureDomain, lm.Status.FailureDomain, m.fd)
		}
		if lm.Status.Domain == nil || lm.Status.Domain.Host != m.addr {
			t.Errorf("%s: status.domain %+v; want host %s", m.name, lm.Status.Domain, m.addr)
		}
		ip, err := netip.ParseAddr(internalIP(lm))
		if err != nil || !lanPrefix.Contains(ip) {
			t.Errorf("%s: address %v is not on the testbed LAN %s (%v)", m.name, lm.Status.Addresses, lanPrefix, err)
		}
		t.Logf("%s on %s: %s", m.name, m.fd, ip)
	}
	t.Logf("FIGURE two machines on two hosts with addresses: %s", time.Since(start).Round(time.Second))
	domA, domB := naming.DomainName(h.ns, "mh-a"), naming.DomainName(h.ns, "mh-b")
	assertDomainOn(t, hostA, hostB, domA)
	assertDomainOn(t, hostB, hostA, domB)
	before, err := hostB.DomainInfo(h.ctx, domB)
	must(t, err)

	// A machine whose host device no host has is placed nowhere: it waits,
	// saying why for each host, and is deleted without a host.
	h.createMachine("mh-gpu", machineOpts{cluster: cluster, withData: true, hostDevices: []infrav1.HostDevice{{Name: "gpu0"}}})
	lm := h.waitCondition("mh-gpu", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.WaitingForHostDeviceReason, time.Minute)
	msg := conditions.Get(lm, infrav1.DomainReadyCondition).Message
	t.Logf("mh-gpu: %s", msg)
	if lm.Spec.FailureDomain != "" || !strings.Contains(msg, "host-a: gpu0: PCI device 0000:fe:1f.7 does not exist") || !strings.Contains(msg, "host-b: gpu0:") {
		t.Errorf("mh-gpu placed in %q, DomainReady %q; want no placement and both hosts' reasons", lm.Spec.FailureDomain, msg)
	}
	h.deleteMachine("mh-gpu", time.Minute)
	for _, host := range []*virt.Client{hostA, hostB} {
		if _, err := host.DomainInfo(h.ctx, naming.DomainName(h.ns, "mh-gpu")); !virt.IsNotFound(err) {
			t.Errorf("mh-gpu's domain on %s: %v", host.URI(), err)
		}
	}

	// Host B goes away: its machine says so within a minute.
	stopping := time.Now()
	tb.Stop("b")
	stopped := time.Now()
	lm = h.waitCondition("mh-b", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.HostUnreachableReason, time.Minute)
	t.Logf("FIGURE HostUnreachable %s after libvirtd exited (stopping it took %s): %s", time.Since(stopped).Round(100*time.Millisecond),
		stopped.Sub(stopping).Round(100*time.Millisecond), conditions.Get(lm, infrav1.DomainReadyCondition).Message)
	if msg := conditions.Get(lm, infrav1.DomainReadyCondition).Message; !strings.Contains(msg, uriB) || strings.Contains(msg, "capl-credentials-") {
		t.Errorf("HostUnreachable message %q does not name %s, or names the manager's credentials directory", msg, uriB)
	}
	// ...while host A's machines go on: a new machine placed there boots.
	h.createMachine("mh-c", machineOpts{cluster: cluster, withData: true, userData: bootUserData(), failureDomain: "host-a"})
	lm = h.waitAddress("mh-c", 6*time.Minute)
	if lm.Spec.FailureDomain != "host-a" {
		t.Errorf("mh-c placed in %q; want host-a", lm.Spec.FailureDomain)
	}
	if _, err := hostA.DomainInfo(h.ctx, naming.DomainName(h.ns, "mh-c")); err != nil {
		t.Errorf("mh-c's domain is not on host a: %v", err)
	}

	// Host B is back: the machine recovers, same domain, never restarted.
	restarted := time.Now()
	tb.Start("b")
	h.waitCondition("mh-b", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, time.Minute)
	t.Logf("FIGURE recovered after libvirtd restarted: %s", time.Since(restarted).Round(100*time.Millisecond))
	after, err := hostB.DomainInfo(h.ctx, domB)
	must(t, err)
	if after.UUID != before.UUID || after.State != "running" {
		t.Errorf("mh-b's domain after the restart: %+v; before: %+v", after, before)
	}

	// Host B drops off the network without closing anything (a power cut
	// or a pulled cable): keepalive notices within a minute. Deleting its
	// machine meanwhile waits for the host.
	unplugged := time.Now()
	tb.Unplug("b")
	h.waitCondition("mh-b", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.HostUnreachableReason, time.Minute)
	t.Logf("FIGURE HostUnreachable %s after host b went off the network", time.Since(unplugged).Round(100*time.Millisecond))
	activity := testenv.ActivityOf(t, "libvirtmachine")
	must(t, h.c.Delete(h.ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "mh-b"}}))
	h.waitFor("mh-b's LibvirtMachine deleted by Cluster API", time.Minute, func() (bool, string) {
		return !h.lm("mh-b").DeletionTimestamp.IsZero(), "no deletion timestamp"
	})
	activity.WaitSettled(t, time.Minute)
	lm = h.lm("mh-b")
	if lm.DeletionTimestamp.IsZero() {
		t.Fatal("mh-b's LibvirtMachine is not being deleted")
	}
	if c := conditions.Get(lm, infrav1.DomainReadyCondition); c == nil || c.Reason != infrav1.HostUnreachableReason {
		t.Errorf("mh-b deleting while its host is down: DomainReady %+v; want reason HostUnreachable", c)
	}
	tb.Plug("b")
	h.deleteMachine("mh-b", 2*time.Minute)
	h.deleteMachine("mh-a", 2*time.Minute)
	h.deleteMachine("mh-c", 2*time.Minute)
	// Leftovers are read by the test's own scanner, not by the listing
	// the provider itself trusts (ListOwned).
	for _, uri := range []string{uriA, tb.URI("b")} {
		objs, err := testlibvirt.Scan(uri)
		must(t, err)
		for _, o := range objs {
			if (o.Kind == testlibvirt.KindDomain || o.Kind == testlibvirt.KindVolume) && strings.Contains(o.Name, h.ns) {
				t.Errorf("%s: %s left behind", uri, o)
			}
		}
	}
}

// assertDomainOn fails unless domain is defined on want and not on other.
func assertDomainOn(t *testing.T, want, other *virt.Client, domain string) {
	t.Helper()
	ctx := context.Background()
	if _, err := want.DomainInfo(ctx, domain); err != nil {
		t.Errorf("domain %s not on %s: %v", domain, want.URI(), err)
	}
	if _, err := other.DomainInfo(ctx, domain); !virt.IsNotFound(err) {
		t.Errorf("domain %s also on %s (%v)", domain, other.URI(), fmt.Sprint(err))
	}
}
