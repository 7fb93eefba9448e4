package controllers_test

import (
	"fmt"
	"net"
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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestLoadBalancerOnBridge runs a cluster's HAProxy VM on a libvirt host
// reached over SSH (the OpenSSH client, with a credentialsRef Secret's
// private key and known_hosts), whose machines sit on a host bridge, the LAN of
// hack/testbed-hosts.sh: no DHCP server of ours can reserve the VM's
// address there, so it takes its own from the LAN's DHCP server and holds
// the user's endpoint as a static address. The endpoint serves from the
// manager's side of the LAN, and deleting the cluster leaves nothing on
// the host.
func TestLoadBalancerOnBridge(t *testing.T) {
	testlibvirt.URI(t)
	tb := testlibvirt.StartTestbed(t, "a")
	sshA := tb.SSHURI("a")
	key, knownHosts := tb.SSHCredentials()
	h := newClusterHarness(t)
	h.options = func(o *manager.Options) { o.LibvirtURIs = []string{sshA} }
	h.startProvider(nil)
	// The test itself looks at the host over TCP.
	hostA := testlibvirt.Client(t, tb.URI("a"))
	must(t, h.c.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "capl-hosts"},
		Data: map[string][]byte{hosts.SSHPrivateKeyKey: key, hosts.KnownHostsKey: knownHosts}}))

	const name = "lbb"
	const endpoint = "10.231.0.240" // outside the LAN's DHCP range (.100-.199)
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}}}
	lc.Spec.Network.Bridge = "br0"
	lc.Spec.FailureDomains = []infrav1.FailureDomainSpec{{Name: "host-a", URI: sshA, ControlPlane: ptr.To(true),
		CredentialsRef: &infrav1.SecretReference{Name: "capl-hosts"}}}
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: endpoint, Port: 6443}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: "capl-lbb", Path: "/var/lib/libvirt/capl-lbb"}
	lc.Spec.LoadBalancer = infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, VirtualHardware: tcgHardware(),
		Image: &infrav1.ImageSource{URL: "file://" + h.lbImage, Checksum: "sha256:" + h.lbImageSum}}
	created := time.Now()
	must(t, h.c.Create(h.ctx, lc))
	h.createOwner(name, false)

	lc = h.waitCluster(name, "serving", 8*time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return conditions.IsTrue(lc, infrav1.LoadBalancerReadyCondition), fmt.Sprint(conditions.Get(lc, infrav1.LoadBalancerReadyCondition))
	})
	t.Logf("FIGURE HAProxy VM on a host bridge serving its static endpoint: %s", time.Since(created).Round(time.Second))
	if lc.Status.LoadBalancer == nil || lc.Status.LoadBalancer.Address != endpoint || lc.Spec.ControlPlaneEndpoint.Host != endpoint {
		t.Errorf("endpoint %+v, load balancer %+v; want %s", lc.Spec.ControlPlaneEndpoint, lc.Status.LoadBalancer, endpoint)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(endpoint, "6443"), 5*time.Second)
	must(t, err)
	_ = conn.Close()

	// The VM runs on host A and holds both addresses: the LAN's lease and
	// the endpoint.
	domain := naming.LoadBalancerDomainName(h.ns, name)
	if _, err := hostA.DomainInfo(h.ctx, domain); err != nil {
		t.Errorf("the HAProxy VM is not on host a: %v", err)
	}
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		t.Errorf("the HAProxy VM is on the manager's host (%v)", err)
	}
	addrs, err := hostA.Addresses(h.ctx, virt.AddressQuery{Domain: domain, MAC: netalloc.MAC(lc.Status.LoadBalancer.Domain.MAC)})
	must(t, err)
	var leased, static bool
	for _, a := range addrs {
		switch {
		case a.IP.String() == endpoint:
			static = true
		case a.IP.Is4() && lanPrefix.Contains(a.IP) && a.IP.As4()[3] >= 100 && a.IP.As4()[3] < 200:
			leased = true
		}
	}
	if !leased || !static {
		t.Errorf("the HAProxy VM's addresses %v; want one leased from the LAN's DHCP range and %s", addrs, endpoint)
	}

	h.deleteAndWait(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}, 4*time.Minute)
	h.waitFor("the LibvirtCluster to go", time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &infrav1.LibvirtCluster{})
		return err != nil, fmt.Sprint(err)
	})
	owned, err := hostA.ListOwned(h.ctx)
	must(t, err)
	for _, o := range owned {
		if o.Kind != virt.OwnedVolume || !strings.HasPrefix(o.Name, naming.ImageVolumeName("")) {
			t.Errorf("%s %s left behind on host a", o.Kind, o.Name)
		}
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(endpoint, "6443"), 2*time.Second); err == nil {
		_ = c.Close()
		t.Errorf("%s still serves after the cluster was deleted", endpoint)
	}
}
