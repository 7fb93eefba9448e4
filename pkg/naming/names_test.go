package naming

import (
	"strings"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

func TestDomainName(t *testing.T) {
	if got := DomainName("default", "worker-0"); got != "capl-default.worker-0" {
		t.Errorf("DomainName = %q", got)
	}
	// Namespaces have no '.', so the first '.' splits them from the name:
	// these pairs would collide with a '-' or '/' joiner, not with '.'.
	pairs := [][2]string{{"a-b", "c"}, {"a", "b-c"}, {"a", "b.c"}, {"ab", "c"}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		n := DomainName(p[0], p[1])
		if other, ok := seen[n]; ok {
			t.Errorf("%v and %v both map to %q", p, other, n)
		}
		seen[n] = p
	}
}

func TestDomainNameLong(t *testing.T) {
	ns := strings.Repeat("n", 63)
	long1 := strings.Repeat("m", 253)
	long2 := strings.Repeat("m", 252) + "x"
	a, b := DomainName(ns, long1), DomainName(ns, long2)
	if a == b {
		t.Fatalf("long names collide: %q", a)
	}
	for _, n := range []string{a, b} {
		if len(n) != hashedDomainNameLen {
			t.Errorf("len(%q) = %d, want %d", n, len(n), hashedDomainNameLen)
		}
		// The longest file libvirt or we derive from it must fit 255 bytes.
		for _, f := range []string{n + "-console.log", OverlayVolumeName(n), SeedVolumeName(n), n + ".log"} {
			if len(f) > 255 {
				t.Errorf("file name %q is %d bytes", f, len(f))
			}
		}
	}
	if DomainName(ns, long1) != a {
		t.Error("DomainName is not deterministic")
	}
	// A plain name is never as long as a hashed one.
	plain := DomainName("n", strings.Repeat("m", maxPlainDomainName-len("capl-n.")))
	if len(plain) != maxPlainDomainName || strings.Contains(plain[len(plain)-17:], "-") {
		t.Errorf("plain name %q (%d) was hashed", plain, len(plain))
	}
}

func TestVolumeNamesAreDisjoint(t *testing.T) {
	d := DomainName("ns", "m")
	names := []string{OverlayVolumeName(d), SeedVolumeName(d), ImageVolumeName(strings.Repeat("ab", 32)),
		DataDiskVolumeName(d, "root"), DataDiskVolumeName(d, "seed")}
	for i := range names {
		if !strings.HasPrefix(names[i], "capl-") {
			t.Errorf("%q lacks the capl- prefix orphan listing relies on", names[i])
		}
		for j := range i {
			if names[i] == names[j] {
				t.Errorf("duplicate name %q", names[i])
			}
		}
	}
	if strings.Contains(ImageVolumeName(strings.Repeat("ab", 32)), ".") {
		t.Error("image volume names must not contain '.', which every machine volume has")
	}
}

// TestDataDiskVolumeOf: a machine's data disks are its own, whatever the
// names of the namespace's other machines (which may end in "_data-..."
// only if a Kubernetes name could hold '_', which none can).
func TestDataDiskVolumeOf(t *testing.T) {
	for _, tc := range []struct {
		domain, volume string
		want           bool
	}{
		{DomainName("ns", "m"), DataDiskVolumeName(DomainName("ns", "m"), "etcd"), true},
		{DomainName("ns", "m"), DataDiskVolumeName(DomainName("ns", "m-data-x"), "etcd"), false},
		{DomainName("ns", "m"), DataDiskVolumeName(DomainName("ns", "m2"), "etcd"), false},
		{DomainName("ns", "m"), OverlayVolumeName(DomainName("ns", "m")), false},
		{DomainName("ns", "m"), DomainName("ns", "m") + "_data-etcd.qcow2_data-x.qcow2", false},
	} {
		if got := IsDataDiskVolumeOf(tc.domain, tc.volume); got != tc.want {
			t.Errorf("IsDataDiskVolumeOf(%s, %s) = %v, want %v", tc.domain, tc.volume, got, tc.want)
		}
	}
}

func TestMACCandidates(t *testing.T) {
	c := MACCandidates("uid", 8)
	if c[0].String() != netalloc.MACFromSeed("uid").String() {
		t.Errorf("first candidate %s is not MACFromSeed(uid)", c[0])
	}
	seen := map[string]bool{}
	for _, m := range c {
		if seen[m.String()] || !strings.HasPrefix(m.String(), "52:54:00:") {
			t.Errorf("bad or duplicate candidate %s", m)
		}
		seen[m.String()] = true
	}
}

// TestNameKinds: the helpers pkg/tenancy judges names with recognise
// exactly the names this file derives.
func TestNameKinds(t *testing.T) {
	long := DomainName(strings.Repeat("n", 63), strings.Repeat("m", 253))
	for _, d := range []string{DomainName("ns", "m"), LoadBalancerDomainName("ns", "c"), long} {
		for _, v := range []string{OverlayVolumeName(d), SeedVolumeName(d), DataDiskVolumeName(d, "etcd")} {
			if !IsManagedVolumeName(v) || IsImageVolumeName(v) {
				t.Errorf("%s: managed %v, image %v", v, IsManagedVolumeName(v), IsImageVolumeName(v))
			}
		}
	}
	if !IsDataDiskVolumeName(DataDiskVolumeName(long, strings.Repeat("d", 20))) || len(DataDiskVolumeName(long, strings.Repeat("d", 20))) > 255 {
		t.Error("a long domain's data disk volume is misjudged or too long for a file name")
	}
	img := ImageVolumeName(strings.Repeat("0f", 32))
	if !IsImageVolumeName(img) || IsManagedVolumeName(img) || !IsManagedVolumeName(img+".partial") {
		t.Errorf("%s misjudged", img)
	}
	for _, n := range []string{"capl-debian-12.qcow2", "ubuntu-root.qcow2", "capi-libvirt-haproxy.qcow2", ImageVolumeName("abc"), img + "0"} {
		if IsManagedVolumeName(n) || IsImageVolumeName(n) {
			t.Errorf("%s taken for a managed or imported volume", n)
		}
	}
	for _, tc := range []struct{ name, ns string }{
		{ClusterNetworkName("team-a", "prod"), "team-a"},
		{DomainName("a-b", "c.d"), "a-b"},
		{long, strings.Repeat("n", 63)},
		{"capl-nodot", ""}, {"default", ""}, {"capl-.x", ""},
	} {
		if ns, ok := NameNamespace(tc.name); ns != tc.ns || ok != (tc.ns != "") {
			t.Errorf("NameNamespace(%s) = %q, %v; want %q", tc.name, ns, ok, tc.ns)
		}
	}
}

func TestIPAddressClaimName(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, tc := range []struct {
		name, machine string
		i             int
		want          string
	}{
		{name: "short", machine: "web-md-0-abcde", i: 0, want: "web-md-0-abcde-ip-0"},
		{name: "second pool", machine: "web-md-0-abcde", i: 1, want: "web-md-0-abcde-ip-1"},
		{name: "at the limit", machine: strings.Repeat("a", 248), i: 0, want: strings.Repeat("a", 248) + "-ip-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IPAddressClaimName(tc.machine, tc.i); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	a, b := IPAddressClaimName(long+"x", 0), IPAddressClaimName(long+"y", 0)
	if len(a) > 253 || a == b || !strings.HasSuffix(a, "-ip-0") {
		t.Fatalf("long names: %q (%d) and %q", a, len(a), b)
	}
	if dotted := IPAddressClaimName(strings.Repeat("a.", 126)+"a", 0); strings.Contains(dotted, ".-") || len(dotted) > 253 {
		t.Fatalf("long dotted name: %q", dotted)
	}
	if got := LoadBalancerIPAddressClaimName("web"); got != "web-lb-ip" {
		t.Fatalf("load balancer's claim: %q", got)
	}
	if lb := LoadBalancerIPAddressClaimName(long); len(lb) > 253 || !strings.HasSuffix(lb, "-lb-ip") {
		t.Fatalf("long load balancer's claim: %q (%d)", lb, len(lb))
	}
}
