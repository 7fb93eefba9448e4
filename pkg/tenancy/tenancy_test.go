package tenancy

import (
	"net/netip"
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

func TestCheckPoolPath(t *testing.T) {
	p := DefaultPolicy()
	wide := Policy{PoolDirs: []string{"/srv", "/var/lib/libvirt"}}
	for _, tc := range []struct {
		policy Policy
		path   string
		want   string // "" accepts; otherwise a fragment of the error
	}{
		{p, "/var/lib/libvirt/capi-libvirt", ""},
		{p, "/var/lib/libvirt/tenants/a", ""},
		{wide, "/srv/pools/x", ""},
		{p, "/", "contains the system directory /bin"},
		{p, "/etc", "system directory /etc"},
		{p, "/etc/libvirt-pool", "system directory /etc"},
		{p, "/usr/share/x", "system directory /usr"},
		{p, "/root", "system directory /root"},
		{p, "/boot/x", "system directory /boot"},
		{p, "/var/lib/libvirt", "contains the system directory /var/lib/libvirt/boot"},
		{p, "/var/lib/libvirt/qemu", "system directory /var/lib/libvirt/qemu"},
		{p, "/var/lib/libvirt/dnsmasq/x", "system directory /var/lib/libvirt/dnsmasq"},
		{p, "/var", "contains the system directory /var/lock"},
		{p, "/var/lib", "contains the system directory"},
		{p, "/srv/x", "below one of /var/lib/libvirt"},
		{p, "/var/lib/libvirtx", "below one of /var/lib/libvirt"},
		{p, "/var/lib/libvirt/../../../etc", "must not contain .."},
		{p, "/var/lib/libvirt/a/", "clean path: /var/lib/libvirt/a"},
		{p, "/var/lib/libvirt//a", "clean path: /var/lib/libvirt/a"},
		{p, "/var/lib/libvirt/./a", "clean path: /var/lib/libvirt/a"},
		{p, "var/lib/libvirt/a", "absolute"},
		// Listed or not, system directories stay out.
		{Policy{PoolDirs: []string{"/etc", "/"}}, "/etc/x", "system directory /etc"},
		{Policy{PoolDirs: []string{"/"}}, "/proc/1", "system directory /proc"},
		{wide, "/srv", "is /srv itself"},
		{Policy{PoolDirs: []string{"/tmp"}}, "/tmp", "is /tmp itself"},
	} {
		err := tc.policy.CheckPoolPath(tc.path)
		check(t, "CheckPoolPath("+tc.path+")", err, tc.want)
	}
}

func TestCheckPool(t *testing.T) {
	p := Policy{PoolDirs: DefaultPoolDirs, Pools: []string{"tenants"}}
	for _, tc := range []struct {
		name, path, field, want string
	}{
		{"tenants", "/var/lib/libvirt/tenants", "", ""},
		{"tenants", "", "", ""},
		{"other", "", "name", "--storage-pools"},
		{"other", "/var/lib/libvirt/other", "name", "--storage-pools"},
		{"tenants", "/etc/tenants", "path", "system directory /etc"},
	} {
		f, err := p.CheckPool(tc.name, tc.path)
		check(t, "CheckPool("+tc.name+", "+tc.path+")", err, tc.want)
		if f != tc.field {
			t.Errorf("CheckPool(%s, %s) blames %q, want %q", tc.name, tc.path, f, tc.field)
		}
	}
	if _, err := DefaultPolicy().CheckPool("anything", ""); err != nil {
		t.Errorf("without --storage-pools any existing pool is allowed: %v", err)
	}
	if _, err := (Policy{PoolDirs: DefaultPoolDirs, Pools: []string{Any}}).CheckPool("anything", ""); err != nil {
		t.Errorf("--storage-pools=* allows any existing pool: %v", err)
	}
}

func TestCheckImageVolume(t *testing.T) {
	p := DefaultPolicy() // image pool capi-libvirt
	domainA := naming.DomainName("team-a", "cp-0")
	lbA := naming.LoadBalancerDomainName("team-a", "prod")
	imported := naming.ImageVolumeName(strings.Repeat("ab", 32))
	for _, tc := range []struct {
		ref         infrav1.VolumeReference
		defaultPool string
		field, want string
	}{
		// Base images.
		{infrav1.VolumeReference{Name: imported}, "tenant-pool", "", ""},
		{infrav1.VolumeReference{Pool: "elsewhere", Name: imported}, "", "", ""},
		{infrav1.VolumeReference{Name: "ubuntu.qcow2"}, "capi-libvirt", "", ""},
		{infrav1.VolumeReference{Pool: "capi-libvirt", Name: "ubuntu.qcow2"}, "tenant-pool", "", ""},
		{infrav1.VolumeReference{Name: "capl-debian-12.qcow2"}, "capi-libvirt", "", ""},
		{infrav1.VolumeReference{Name: infrav1.DefaultLoadBalancerImageVolume}, "tenant-pool", "", ""},
		// Unknown pool (a template): left to the controller.
		{infrav1.VolumeReference{Name: "ubuntu.qcow2"}, "", "", ""},
		// Another namespace's (or any) machine's and load balancer's volumes,
		// even in an image pool.
		{infrav1.VolumeReference{Name: naming.OverlayVolumeName(domainA)}, "capi-libvirt", "name", "manages for a machine"},
		{infrav1.VolumeReference{Name: naming.SeedVolumeName(domainA)}, "capi-libvirt", "name", "manages for a machine"},
		{infrav1.VolumeReference{Pool: "capi-libvirt", Name: naming.SeedVolumeName(domainA)}, "", "name", "manages for a machine"},
		{infrav1.VolumeReference{Name: naming.OverlayVolumeName(lbA)}, "", "name", "manages for a machine"},
		{infrav1.VolumeReference{Name: naming.SeedVolumeName(lbA)}, "", "name", "manages for a machine"},
		{infrav1.VolumeReference{Name: imported + ".partial"}, "capi-libvirt", "name", "import under way"},
		// Volumes outside the image pools.
		{infrav1.VolumeReference{Name: "ubuntu.qcow2"}, "tenant-pool", "name", "pool tenant-pool is none"},
		{infrav1.VolumeReference{Pool: "default", Name: "ubuntu.qcow2"}, "capi-libvirt", "pool", "pool default is none"},
		{infrav1.VolumeReference{Name: naming.ImageVolumeName(strings.Repeat("AB", 32))}, "tenant-pool", "name", "is none"},
	} {
		f, err := p.CheckImageVolume(tc.ref, tc.defaultPool)
		what := "CheckImageVolume(" + tc.ref.Pool + "/" + tc.ref.Name + ", " + tc.defaultPool + ")"
		check(t, what, err, tc.want)
		if f != tc.field {
			t.Errorf("%s blames %q, want %q", what, f, tc.field)
		}
	}
}

func TestCheckNetworkAndBridge(t *testing.T) {
	open := DefaultPolicy()
	listed := Policy{PoolDirs: DefaultPoolDirs, Networks: []string{"default"}, Bridges: []string{"br0"}}
	for _, tc := range []struct {
		policy  Policy
		network string
		want    string
	}{
		{open, naming.ClusterNetworkName("team-a", "prod"), ""},
		{open, naming.ClusterNetworkName("team-b", "prod"), "namespace team-b"},
		{open, naming.ClusterNetworkName("team-a-b", "prod"), "namespace team-a-b"},
		{open, "default", ""},
		{listed, "default", ""},
		{listed, "lab", "--libvirt-networks"},
		{Policy{Networks: []string{Any}}, "lab", ""},
		{Policy{Networks: []string{Any}}, naming.ClusterNetworkName("team-b", "prod"), "namespace team-b"},
		{listed, naming.ClusterNetworkName("team-a", "prod"), ""},
		{listed, naming.ClusterNetworkName("team-b", "prod"), "namespace team-b"},
		{Policy{Networks: []string{None}}, "default", "allows none"},
		{Policy{Networks: []string{None}}, naming.ClusterNetworkName("team-a", "prod"), ""},
	} {
		check(t, "CheckNetwork(team-a, "+tc.network+")", tc.policy.CheckNetwork("team-a", tc.network), tc.want)
	}
	provider := netalloc.BridgeName(naming.ClusterNetworkName("team-b", "prod"))
	for _, tc := range []struct {
		policy Policy
		bridge string
		want   string
	}{
		{open, "br0", ""},
		{open, "virbr0", ""},
		{open, provider, "bridge of a network the provider made"},
		{listed, "br0", ""},
		{listed, "virbr0", "--host-bridges"},
		{Policy{Bridges: []string{Any}}, "virbr0", ""},
		{Policy{Bridges: []string{Any}}, provider, "bridge of a network the provider made"},
		{Policy{Bridges: []string{provider}}, provider, "bridge of a network the provider made"},
		{Policy{Bridges: []string{None}}, "br0", "allows none"},
	} {
		check(t, "CheckBridge("+tc.bridge+")", tc.policy.CheckBridge(tc.bridge), tc.want)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		dirs []string
		want string
	}{
		{DefaultPoolDirs, ""},
		{[]string{"/srv/pools", "/var/lib/libvirt"}, ""},
		{nil, "no storage pool directory"},
		{[]string{"/"}, "anywhere"},
		{[]string{"/etc"}, "system directory /etc"},
		{[]string{"/var/lib/libvirt/qemu"}, "system directory"},
		{[]string{"srv"}, "absolute"},
		{[]string{"/srv/../etc"}, ".."},
		{[]string{"/srv/"}, "clean"},
	} {
		check(t, "Validate("+strings.Join(tc.dirs, ",")+")", Policy{PoolDirs: tc.dirs}.Validate(), tc.want)
	}
}

func check(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s refused: %v", what, err)
	case want != "" && err == nil:
		t.Errorf("%s accepted, want an error with %q", what, want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("%s: %v, want %q in it", what, err, want)
	}
}

func TestCheckImageURL(t *testing.T) {
	allowed := Policy{ImageFileDirs: []string{"/var/cache/capi-libvirt/images"}}
	for _, tc := range []struct {
		policy Policy
		url    string
		want   string
	}{
		{Policy{}, "https://images.example/debian.qcow2", ""},
		{Policy{}, "http://10.0.0.5/debian.qcow2", ""},
		{Policy{}, "file:///var/cache/capi-libvirt/images/node.qcow2", "allows no directory"},
		{allowed, "file:///var/cache/capi-libvirt/images/node.qcow2", ""},
		{allowed, "file:///var/cache/capi-libvirt/images/../../../../etc/shadow", "must name a file below"},
		{allowed, "file:///var/cache/capi-libvirt/images", "must name a file below"},
		{allowed, "file:///var/cache/capi-libvirt/images-other/x.qcow2", "must name a file below"},
		{allowed, "file:///etc/shadow", "must name a file below"},
	} {
		check(t, "CheckImageURL("+tc.url+")", tc.policy.CheckImageURL(tc.url), tc.want)
	}
	check(t, "Validate(image file dir /)", Policy{PoolDirs: DefaultPoolDirs, ImageFileDirs: []string{"/"}}.Validate(), "any file")
	check(t, "Validate(image file dir relative)", Policy{PoolDirs: DefaultPoolDirs, ImageFileDirs: []string{"images"}}.Validate(), "absolute")
}

func TestCheckLibvirtURI(t *testing.T) {
	listed := Policy{ManagerURI: "qemu:///system", LibvirtURIs: []string{"qemu+ssh://root@kvm1/system", "qemu+ssh://kvm2/system?no_verify=1", "qemu+tcp://127.0.0.1/system"}}
	deny := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("169.254.0.0/16")}
	anyURI := Policy{ManagerURI: "qemu:///system", LibvirtURIs: []string{Any}, HostDenyNets: deny}
	closed := Policy{ManagerURI: "qemu:///system"}
	for _, tc := range []struct {
		name   string
		policy Policy
		uri    string
		creds  bool   // the failure domain has a credentialsRef
		want   string // "" for allowed, else a part of the error
	}{
		{"empty is the manager's host", closed, "", false, ""},
		{"the manager's own URI", closed, "qemu:///system", false, ""},
		{"closed by default", closed, "qemu+ssh://kvm1/system", true, "allows no libvirt host"},
		{"none", Policy{LibvirtURIs: []string{None}}, "qemu+ssh://kvm1/system", true, "allows no libvirt host"},
		{"listed", listed, "qemu+ssh://root@kvm1/system", false, ""},
		{"listed with its query", listed, "qemu+ssh://kvm2/system?no_verify=1", false, ""},
		{"listed loopback is the operator's choice", listed, "qemu+tcp://127.0.0.1/system", false, ""},
		{"not listed", listed, "qemu+ssh://kvm3/system", true, "must be one of"},
		{"any", anyURI, "qemu+tls://kvm3:16514/system", true, ""},
		{"any: ssh with credentials", anyURI, "qemu+ssh://root@10.0.0.5/system", true, ""},
		{"any: without credentials", anyURI, "qemu+ssh://kvm3/system", false, "needs credentialsRef"},
		{"any: tls without credentials", anyURI, "qemu+tls://kvm3/system", false, "needs credentialsRef"},
		{"any: tcp takes none", anyURI, "qemu+tcp://10.0.0.5/system", false, "needs credentialsRef"},
		{"any: upper-case libssh without credentials", anyURI, "qemu+LIBSSH://kvm3/system", false, "needs credentialsRef"},
		{"any: upper-case ext", anyURI, "QEMU+EXT:///system", true, "scheme"},
		{"any: loopback", anyURI, "qemu+tls://127.0.0.1:16514/system", true, "127.0.0.0/8"},
		{"any: loopback v6", anyURI, "qemu+ssh://[::1]/system", true, "::1/128"},
		{"any: v4-mapped loopback", anyURI, "qemu+ssh://[::ffff:127.0.0.2]/system", true, "127.0.0.0/8"},
		{"any: link-local metadata", anyURI, "qemu+ssh://169.254.169.254:22/system", true, "169.254.0.0/16"},
		{"any: a query runs commands", anyURI, "qemu+ssh://kvm3/system?command=/bin/sh", true, "query parameters"},
		{"any: ext runs a program", anyURI, "qemu+ext:///system?command=/bin/sh", true, "scheme"},
		{"any: unix names a socket", anyURI, "qemu+unix:///system?socket=/tmp/s", true, "scheme"},
		{"any: session driver", anyURI, "qemu+ssh://kvm3/session", true, "/system"},
		{"any: another driver", anyURI, "lxc+ssh://kvm3/system", true, "scheme"},
		{"any: remote without host", anyURI, "qemu+ssh:///system", true, "needs a host"},
		{"any: local with a host", anyURI, "qemu://kvm3/system", true, "names no host"},
		{"any: a password", anyURI, "qemu+ssh://root:pw@kvm3/system", true, "password"},
		{"listed but malformed", Policy{LibvirtURIs: []string{"qemu+ext:///system"}}, "qemu+ext:///system", false, "scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.policy.CheckLibvirtURI(tc.uri, tc.creds)
			check(t, "CheckLibvirtURI("+tc.uri+")", err, tc.want)
		})
	}
}

func TestParseLibvirtURISchemeCase(t *testing.T) {
	for _, tc := range []struct{ uri, kind, want string }{
		{"qemu+LIBSSH://kvm1/system", CredentialsSSH, ""},
		{"Qemu+TLS://kvm1/system", CredentialsTLS, ""},
		{"QEMU+TCP://kvm1/system", "", ""},
		{"QEMU://kvm1/system", "", "names no host"},
		{"QEMU+Unix:///system", "", "scheme"},
	} {
		kind, err := ParseLibvirtURI(tc.uri)
		check(t, "ParseLibvirtURI("+tc.uri+")", err, tc.want)
		if err == nil && kind != tc.kind {
			t.Errorf("ParseLibvirtURI(%s) = %q; want %q", tc.uri, kind, tc.kind)
		}
	}
}

func TestOnlyAny(t *testing.T) {
	p := Policy{ManagerURI: "qemu:///system", LibvirtURIs: []string{Any, "qemu+ssh://kvm1/system"}}
	for uri, want := range map[string]bool{
		"": false, "qemu:///system": false, "qemu+ssh://kvm1/system": false, "qemu+ssh://kvm2/system": true,
	} {
		if got := p.OnlyAny(uri); got != want {
			t.Errorf("OnlyAny(%q) = %v; want %v", uri, got, want)
		}
	}
}
