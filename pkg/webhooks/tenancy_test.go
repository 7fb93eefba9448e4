package webhooks

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The tenant of these tests is namespace team-b; team-a is the neighbour
// whose disks, seeds and network it must not reach.
const tenant = "team-b"

var (
	domainA     = naming.DomainName("team-a", "cp-0")
	rootA       = naming.OverlayVolumeName(domainA)
	seedA       = naming.SeedVolumeName(domainA)
	lbSeedA     = naming.SeedVolumeName(naming.LoadBalancerDomainName("team-a", "prod"))
	networkA    = naming.ClusterNetworkName("team-a", "prod")
	bridgeA     = netalloc.BridgeName(networkA)
	ownNetwork  = naming.ClusterNetworkName(tenant, "prod")
	importedImg = naming.ImageVolumeName(strings.Repeat("5e", 32))

	poolKey    = "[" + scope.PoolAnnotation + "]"
	networkKey = "[" + scope.NetworkAnnotation + "]"
)

// Policies: the flags' defaults, and an operator who listed everything.
var (
	defaultPolicy = tenancy.DefaultPolicy()
	strictPolicy  = tenancy.Policy{
		PoolDirs: []string{"/var/lib/libvirt"}, Pools: []string{"capi-libvirt", "tenants"},
		ImagePools: []string{"capi-libvirt"}, Bridges: []string{"br0"}, Networks: []string{"default"},
	}
	hostsPolicy = func() tenancy.Policy {
		p := tenancy.DefaultPolicy()
		p.ManagerURI, p.LibvirtURIs = "qemu:///system", []string{"qemu+ssh://kvm1/system", "qemu+tcp://kvm2/system"}
		return p
	}()
)

// anyHostPolicy lets failure domains name any libvirt host (--libvirt-uris=*)
// but those at the image imports' denied addresses.
var anyHostPolicy = func() tenancy.Policy {
	p := tenancy.DefaultPolicy()
	p.ManagerURI, p.LibvirtURIs = "qemu:///system", []string{tenancy.Any}
	p.HostDenyNets = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16")}
	return p
}()

// filteredPolicy guards shared segments with the flag's default filter.
var filteredPolicy = func() tenancy.Policy {
	p := hostsPolicy
	p.TrafficFilter = virt.CleanTrafficFilter
	return p
}()

// haproxyOnBridge puts twoHosts' cluster behind an HAProxy VM holding a
// static endpoint on the bridge.
func haproxyOnBridge(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
	twoHosts(s, m)
	s.LoadBalancer.Type = infrav1.LoadBalancerHAProxy
}

// twoHosts spreads a cluster over the manager's host and kvm1.
func twoHosts(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
	s.FailureDomains = []infrav1.FailureDomainSpec{
		{Name: "local", ControlPlane: ptr.To(true)},
		{Name: "kvm1", URI: "qemu+ssh://kvm1/system", CredentialsRef: &infrav1.SecretReference{Name: "kvm1"}},
	}
	s.Network.Bridge, s.LoadBalancer.Type, s.ControlPlaneEndpoint.Host = "br0", infrav1.LoadBalancerNone, "192.168.1.240"
}

// refusedFields returns the fields an admission error names, or nil.
func refusedFields(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var status *apierrors.StatusError
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) || status.ErrStatus.Details == nil {
		t.Fatalf("not an Invalid error: %v", err)
	}
	var out []string
	for _, c := range status.ErrStatus.Details.Causes {
		out = append(out, c.Field)
	}
	return out
}

func checkFields(t *testing.T, name string, err error, want []string) {
	t.Helper()
	got := refusedFields(t, err)
	if !slices.Equal(got, want) {
		t.Errorf("%s: refused %v, want %v (%v)", name, got, want, err)
	}
}

func TestClusterReferences(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		policy tenancy.Policy
		mutate func(*infrav1.LibvirtClusterSpec, *metav1.ObjectMeta)
		want   []string // refused fields below spec (or metadata.annotations), none to accept
	}{
		{"defaults", defaultPolicy, nil, nil},
		{"pool below the pool directories", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "team-b", Path: "/var/lib/libvirt/team-b"}
		}, nil},
		{"own network", strictPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.Name = ownNetwork }, nil},
		{"listed network", strictPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.Name = "default" }, nil},
		{"imported HAProxy image in any pool", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: "anywhere", Name: importedImg}}
		}, nil},
		{"pool at /", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "root", Path: "/"}
		}, []string{"spec.storagePool.path"}},
		{"pool in /etc", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "etc", Path: "/etc"}
		}, []string{"spec.storagePool.path"}},
		{"pool in /etc even if listed", tenancy.Policy{PoolDirs: []string{"/etc"}}, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "etc", Path: "/etc/pool"}
		}, []string{"spec.storagePool.path"}},
		{"pool over libvirt's domain state", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "q", Path: "/var/lib/libvirt/qemu"}
		}, []string{"spec.storagePool.path"}},
		{"pool escaping with ..", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "x", Path: "/var/lib/libvirt/../../../etc"}
		}, []string{"spec.storagePool.path"}},
		{"pool outside the pool directories", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "x", Path: "/srv/x"}
		}, []string{"spec.storagePool.path"}},
		{"pool not listed", strictPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "default"}
		}, []string{"spec.storagePool.name"}},
		{"another namespace's network", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.Name = networkA },
			[]string{"spec.network.name"}},
		{"network not listed", strictPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.Name = "lab" },
			[]string{"spec.network.name"}},
		{"another namespace's network's bridge", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.Network.Bridge, s.LoadBalancer.Type = bridgeA, infrav1.LoadBalancerNone
			s.ControlPlaneEndpoint.Host = "192.168.1.10"
		}, []string{"spec.network.bridge"}},
		{"bridge not listed", strictPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.Network.Bridge, s.LoadBalancer.Type = "virbr0", infrav1.LoadBalancerNone
			s.ControlPlaneEndpoint.Host = "192.168.1.10"
		}, []string{"spec.network.bridge"}},
		{"HAProxy image on another namespace's seed", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: lbSeedA}}
		}, []string{"spec.loadBalancer.image.volume.name"}},
		{"HAProxy image outside the image pools", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: "default", Name: "haproxy.qcow2"}}
		}, []string{"spec.loadBalancer.image.volume.pool"}},
		{"HAProxy image in a pool that is not an image pool", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.StoragePool = infrav1.StoragePool{Name: "team-b", Path: "/var/lib/libvirt/team-b"}
			s.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "haproxy.qcow2"}}
		}, []string{"spec.loadBalancer.image.volume.name"}},
		{"two hosts on a bridge", hostsPolicy, twoHosts, nil},
		{"the HAProxy VM on a bridge without a traffic filter", hostsPolicy, haproxyOnBridge, nil},
		{"the HAProxy VM on a bridge under the traffic filter", filteredPolicy, haproxyOnBridge, []string{"spec.loadBalancer.type"}},
		{"the HAProxy VM on a bridge under the traffic filter, its address from a pool", filteredPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			haproxyOnBridge(s, m)
			s.ControlPlaneEndpoint.Host = ""
			s.LoadBalancer.AddressFromPool = &infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
		}, nil},
		{"the manager's host named twice", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "a", ControlPlane: ptr.To(true)}, {Name: "b", URI: "qemu:///system"}}
		}, nil},
		{"a host the operator did not list", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI = "qemu+ssh://kvm9/system"
		}, []string{"spec.failureDomains[1].uri"}},
		{"hosts closed by default", defaultPolicy, twoHosts, []string{"spec.failureDomains[1].uri"}},
		{"two hosts on a NAT network", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.Network.Bridge, s.LoadBalancer.Type, s.ControlPlaneEndpoint.Host = "", infrav1.LoadBalancerHAProxy, ""
		}, []string{"spec.network"}},
		{"credentials on a transport without any", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI = "qemu+tcp://kvm2/system"
		}, []string{"spec.failureDomains[1].credentialsRef"}},
		{"a URI that runs a command", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI = "qemu+ext:///system?command=/bin/sh"
		}, []string{"spec.failureDomains[1].uri"}},
		{"no failure domain for the control plane", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[0].ControlPlane = nil
		}, []string{"spec.failureDomains"}},
		{"load balancer in an unknown failure domain", hostsPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.LoadBalancer.FailureDomain = "kvm7"
		}, []string{"spec.loadBalancer.failureDomain"}},
		{"a private network range", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.CIDR = "10.20.0.0/24" }, nil},
		{"a public network range", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.CIDR = "8.8.8.0/24" },
			[]string{"spec.network.cidr"}},
		{"a range straddling a private one", defaultPolicy, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) { s.Network.CIDR = "172.0.0.0/16" },
			[]string{"spec.network.cidr"}},
		{"any range when the operator allows it", tenancy.Policy{PoolDirs: tenancy.DefaultPoolDirs}, func(s *infrav1.LibvirtClusterSpec, _ *metav1.ObjectMeta) {
			s.Network.CIDR = "8.8.8.0/24"
		}, nil},
		{"any host with credentials", anyHostPolicy, twoHosts, nil},
		{"any host without credentials", anyHostPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].CredentialsRef = nil
		}, []string{"spec.failureDomains[1].uri"}},
		{"any host over upper-case libssh without credentials", anyHostPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI, s.FailureDomains[1].CredentialsRef = "qemu+LIBSSH://kvm1/system", nil
		}, []string{"spec.failureDomains[1].uri"}},
		{"any host over upper-case libssh with credentials", anyHostPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI = "qemu+LIBSSH://kvm1/system"
		}, nil},
		{"any host at a loopback address", anyHostPolicy, func(s *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			twoHosts(s, m)
			s.FailureDomains[1].URI = "qemu+tls://127.0.0.1:16514/system"
			s.FailureDomains[1].CredentialsRef = &infrav1.SecretReference{Name: "tls"}
		}, []string{"spec.failureDomains[1].uri"}},
		{"recorded pool not listed", strictPolicy, func(_ *infrav1.LibvirtClusterSpec, m *metav1.ObjectMeta) {
			m.Annotations = map[string]string{scope.PoolAnnotation: "default"}
		}, []string{"metadata.annotations" + poolKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "prod"}}
			if tc.mutate != nil {
				tc.mutate(&c.Spec, &c.ObjectMeta)
			}
			w := &LibvirtCluster{refs: references{policy: &tc.policy}}
			must(t, w.Default(ctx, c))
			_, err := w.ValidateCreate(ctx, c)
			checkFields(t, "LibvirtCluster", err, tc.want)

			// A template refuses the same at spec.template.
			tmpl := &infrav1.LibvirtClusterTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "prod"}}
			tmpl.Spec.Template.Spec = c.Spec
			tmpl.Spec.Template.Spec.ControlPlaneEndpoint.Host = ""
			if c.Spec.LoadBalancer.Type == infrav1.LoadBalancerNone {
				return // a template cannot name the endpoint host that type None needs
			}
			tmpl.Spec.Template.ObjectMeta.Annotations = c.Annotations
			_, err = (&LibvirtClusterTemplate{refs: references{policy: &tc.policy}}).ValidateCreate(ctx, tmpl)
			checkFields(t, "LibvirtClusterTemplate", err, templatePaths(tc.want))
		})
	}
}

func TestMachineReferences(t *testing.T) {
	ctx := context.Background()
	// Below the defaults (2 vCPUs, 2048 MiB, 20 GiB) in vCPUs and memory.
	cappedPolicy := defaultPolicy
	cappedPolicy.Machine = tenancy.Limits{VCPUs: 1, MemoryMiB: 1024, DiskGiB: 20}
	volume := func(pool, name string) infrav1.ImageSource {
		return infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: pool, Name: name}}
	}
	for _, tc := range []struct {
		name        string
		policy      tenancy.Policy
		image       infrav1.ImageSource
		network     *infrav1.NetworkAttachment
		annotations map[string]string
		want        []string
	}{
		{"imported image", defaultPolicy, volume("", importedImg), nil, nil, nil},
		{"image of an image pool", defaultPolicy, volume("capi-libvirt", "ubuntu.qcow2"), nil, nil, nil},
		{"image from a url", defaultPolicy, infrav1.ImageSource{URL: "https://example.com/x.qcow2", Checksum: "sha256:" + strings.Repeat("5e", 32)}, nil, nil, nil},
		{"file:// with no directory allowed", defaultPolicy, infrav1.ImageSource{URL: "file:///etc/shadow", Checksum: "sha256:" + strings.Repeat("5e", 32)}, nil, nil,
			[]string{"spec.image.url"}},
		{"own network", strictPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Name: ownNetwork}, nil, nil},
		{"larger than one machine may be", cappedPolicy, infrav1.ImageSource{URL: "https://example.com/x.qcow2", Checksum: "sha256:" + strings.Repeat("5e", 32)}, nil, nil,
			[]string{"spec.cpus", "spec.memoryMiB"}},
		{"listed bridge", strictPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Bridge: "br0"}, nil, nil},
		{"provider's own placement", strictPolicy, volume("", importedImg), nil,
			map[string]string{scope.PoolAnnotation: "tenants", scope.NetworkAnnotation: "network:" + ownNetwork}, nil},
		{"another namespace's root disk", defaultPolicy, volume("", rootA), nil, nil, []string{"spec.image.volume.name"}},
		{"another namespace's seed ISO", defaultPolicy, volume("capi-libvirt", seedA), nil, nil, []string{"spec.image.volume.name"}},
		{"another namespace's load balancer seed", defaultPolicy, volume("", lbSeedA), nil, nil, []string{"spec.image.volume.name"}},
		{"an import under way", defaultPolicy, volume("", importedImg+".partial"), nil, nil, []string{"spec.image.volume.name"}},
		{"a volume outside the image pools", defaultPolicy, volume("default", "ubuntu.qcow2"), nil, nil, []string{"spec.image.volume.pool"}},
		{"a volume of its own pool that is not an image pool", defaultPolicy, volume("", "ubuntu.qcow2"), nil,
			map[string]string{scope.PoolAnnotation: "team-b"}, []string{"spec.image.volume.name"}},
		{"another namespace's network", defaultPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Name: networkA}, nil,
			[]string{"spec.network.name"}},
		{"another namespace's network's bridge", defaultPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Bridge: bridgeA}, nil,
			[]string{"spec.network.bridge"}},
		{"network not listed", strictPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Name: "lab"}, nil,
			[]string{"spec.network.name"}},
		{"bridge not listed", strictPolicy, volume("", importedImg), &infrav1.NetworkAttachment{Bridge: "virbr0"}, nil,
			[]string{"spec.network.bridge"}},
		{"forged pool", strictPolicy, volume("", importedImg), nil, map[string]string{scope.PoolAnnotation: "default"},
			[]string{"metadata.annotations" + poolKey}},
		{"forged network", defaultPolicy, volume("", importedImg), nil, map[string]string{scope.NetworkAnnotation: "network:" + networkA},
			[]string{"metadata.annotations" + networkKey}},
		{"forged bridge", defaultPolicy, volume("", importedImg), nil, map[string]string{scope.NetworkAnnotation: "bridge:" + bridgeA},
			[]string{"metadata.annotations" + networkKey}},
		{"everything at once", strictPolicy, volume("", seedA), &infrav1.NetworkAttachment{Name: networkA},
			map[string]string{scope.PoolAnnotation: "default"},
			[]string{"spec.image.volume.name", "spec.network.name", "metadata.annotations" + poolKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "cp-0", Annotations: tc.annotations}}
			m.Spec.Image, m.Spec.Network = tc.image, tc.network
			w := &LibvirtMachine{refs: references{policy: &tc.policy}}
			must(t, w.Default(ctx, m))
			_, err := w.ValidateCreate(ctx, m)
			checkFields(t, "LibvirtMachine", err, tc.want)

			// A template knows no pool for images without one.
			tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "cp"}}
			tmpl.Spec.Template.Spec = m.Spec
			tmpl.Spec.Template.ObjectMeta.Annotations = tc.annotations
			want := templatePaths(tc.want)
			if tc.name == "a volume of its own pool that is not an image pool" {
				want = nil // left to the controller, which knows the pool
			}
			_, err = (&LibvirtMachineTemplate{refs: references{policy: &tc.policy}}).ValidateCreate(ctx, tmpl)
			checkFields(t, "LibvirtMachineTemplate", err, want)
		})
	}
}

// templatePaths moves spec and metadata paths under spec.template.
func templatePaths(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, "spec.template."+p)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
