package virt

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

var testOwner = Owner{Kind: "LibvirtCluster", Namespace: "default", Name: "demo", UID: "8f1c1f9e-3b8e-4a55-9d61-0c7b0c6a1e42", Cluster: "demo"}

func TestNetworkXMLGolden(t *testing.T) {
	tests := []struct {
		golden string
		spec   NetworkSpec
		subnet string
	}{
		{"network-nat.xml", NetworkSpec{Name: "capl-default-demo", Owner: testOwner}, "192.168.150.0/24"},
		{"network-nat-22.xml", NetworkSpec{Name: "capl-default-big", Owner: testOwner, Bridge: "caplbig"}, "10.200.4.0/22"},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			bridge := tt.spec.Bridge
			if bridge == "" {
				bridge = netalloc.BridgeName(tt.spec.Name)
			}
			def, err := networkXML(tt.spec, bridge, netip.MustParsePrefix(tt.subnet))
			if err != nil {
				t.Fatal(err)
			}
			doc, err := def.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			assertGolden(t, tt.golden, doc+"\n")
			// What we write must read back as ours, with the same facts.
			f, err := parseNetwork(doc)
			if err != nil {
				t.Fatal(err)
			}
			if f.owner == nil || *f.owner != testOwner || f.subnet.String() != tt.subnet || f.bridge != bridge || !f.dhcp || f.ipIndex != 0 {
				t.Errorf("parsed back %+v", f)
			}
		})
	}
}

func TestHostEntryXMLGolden(t *testing.T) {
	add, err := hostEntryXML("52:54:00:ab:cd:ef", netip.MustParseAddr("192.168.150.10"), "demo-cp-0")
	if err != nil {
		t.Fatal(err)
	}
	assertGolden(t, "network-host.xml", add+"\n")
	del, err := hostDeleteXML("52:54:00:ab:cd:ef")
	if err != nil {
		t.Fatal(err)
	}
	assertGolden(t, "network-host-delete.xml", del+"\n")
}

func TestParseNetwork(t *testing.T) {
	tests := []struct {
		name       string
		doc        string
		wantSubnet string
		wantIndex  int
		wantDHCP   bool
		wantHosts  int
		// wantHostMAC is the first host entry's MAC, read in canonical
		// form whatever case the XML has it in.
		wantHostMAC netalloc.MAC
		wantOwner   bool
		wantPrefix  int
	}{
		{
			name: "default network with netmask",
			doc: `<network><name>default</name><forward mode='nat'/><bridge name='virbr0'/>
<ip address='192.168.122.1' netmask='255.255.255.0'><dhcp><range start='192.168.122.2' end='192.168.122.254'/>
<host mac='52:54:00:00:00:0A' ip='192.168.122.5' name='a'/></dhcp></ip></network>`,
			wantSubnet: "192.168.122.0/24", wantIndex: 0, wantDHCP: true, wantHosts: 1, wantHostMAC: "52:54:00:00:00:0a", wantPrefix: 1,
		},
		{
			name: "IPv6 first, IPv4 second",
			doc: `<network><name>dual</name><ip family='ipv6' address='fd00::1' prefix='64'/>
<ip address='10.1.2.1' prefix='16'/></network>`,
			wantSubnet: "10.1.0.0/16", wantIndex: 1, wantPrefix: 1,
		},
		{
			name:      "bridged network without addressing",
			doc:       `<network><name>br</name><forward mode='bridge'/><bridge name='br0'/></network>`,
			wantIndex: -1,
		},
		{
			name: "ours",
			doc: `<network><name>capl-x</name><metadata><capl:owner xmlns:capl="https://capi-libvirt.dev/xmlns/owner/v1">
<capl:kind>LibvirtCluster</capl:kind><capl:name>x</capl:name></capl:owner></metadata>
<ip address='10.9.9.1' prefix='24'/><ip address='10.9.10.1' prefix='24'/></network>`,
			wantSubnet: "10.9.9.0/24", wantIndex: 0, wantOwner: true, wantPrefix: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseNetwork(tt.doc)
			if err != nil {
				t.Fatal(err)
			}
			subnet := ""
			if f.subnet.IsValid() {
				subnet = f.subnet.String()
			}
			if subnet != tt.wantSubnet || f.ipIndex != tt.wantIndex || f.dhcp != tt.wantDHCP ||
				len(f.hosts) != tt.wantHosts || (f.owner != nil) != tt.wantOwner || len(f.prefixes) != tt.wantPrefix {
				t.Errorf("got %+v", f)
			}
			if tt.wantHosts > 0 && f.hosts[0].MAC != tt.wantHostMAC {
				t.Errorf("host entry MAC %q, want %q", f.hosts[0].MAC, tt.wantHostMAC)
			}
		})
	}
}

func TestNetworksInUseAndBridgeTaken(t *testing.T) {
	nets := []libvirtNetwork{
		{facts: networkFacts{name: "default", bridge: "virbr0", prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.122.0/24")}}},
		{facts: networkFacts{name: "self", bridge: "caplself", prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.150.0/24")}}, active: true},
		{facts: networkFacts{name: "lab", bridge: "br-lab", prefixes: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}}, active: true},
	}
	inUse := networksInUse(nets, "self")
	if len(inUse) != 2 {
		t.Fatalf("inUse = %v, want the two other networks", inUse)
	}
	tests := []struct {
		name      string
		requested string
		wantErr   string
	}{
		{"overlaps an inactive network", "192.168.122.0/24", `CIDR 192.168.122.0/24 conflicts with libvirt network "default" (inactive) (192.168.122.0/24)`},
		{"inside an active network", "10.200.0.128/25", `CIDR 10.200.0.128/25 conflicts with libvirt network "lab" (active) (10.200.0.0/24)`},
		{"own subnet is free for itself", "192.168.150.0/24", ""},
		{"free", "10.201.0.0/24", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := netalloc.ChooseSubnet(netip.MustParsePrefix(tt.requested), inUse, nil)
			if got := errString(err); got != tt.wantErr {
				t.Errorf("err = %q, want %q", got, tt.wantErr)
			}
		})
	}
	if got, ok := bridgeTaken(nets, "self", "virbr0"); !ok || got != `libvirt network "default" (inactive)` {
		t.Errorf("bridgeTaken(virbr0) = %q, %v", got, ok)
	}
	if _, ok := bridgeTaken(nets, "self", "caplself"); ok {
		t.Error("a network's own bridge counted as taken")
	}
}

func TestSubnetError(t *testing.T) {
	spec := NetworkSpec{Name: "n", CIDR: netip.MustParsePrefix("192.0.2.0/24")}
	inUse := []netalloc.InUse{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Owner: "address on eth0"}}
	tests := []struct {
		name       string
		requested  netip.Prefix
		candidates []netip.Prefix
		wantReason NetworkConflictReason
		wantWith   string
	}{
		{"host conflict", spec.CIDR, nil, ConflictSubnet, "overlaps address on eth0 (192.0.2.0/24)"},
		{"no free subnet", netip.Prefix{}, []netip.Prefix{spec.CIDR}, ConflictNoFreeSubnet, ""},
		{"invalid", netip.MustParsePrefix("127.0.0.0/24"), nil, ConflictInvalidSpec, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := netalloc.ChooseSubnet(tt.requested, inUse, tt.candidates)
			err = subnetError(NetworkSpec{Name: "n", CIDR: tt.requested}, err)
			var ce *NetworkConflictError
			if !errors.As(err, &ce) || !errors.Is(err, ErrNetworkConflict) {
				t.Fatalf("err = %v, want a NetworkConflictError", err)
			}
			if ce.Reason != tt.wantReason || (tt.wantWith != "" && ce.With != tt.wantWith) {
				t.Errorf("got reason %s with %q", ce.Reason, ce.With)
			}
		})
	}
}

func TestStartConflict(t *testing.T) {
	tests := []struct {
		msg  string
		want bool
	}{
		{"internal error: Network is already in use by interface eth0", true},
		{"error creating bridge interface capl1: File exists", true},
		{"Failed to start dnsmasq: permission denied", false},
	}
	for _, tt := range tests {
		if got := startConflict(tt.msg); got != tt.want {
			t.Errorf("startConflict(%q) = %v", tt.msg, got)
		}
	}
}

func TestInterfaceUses(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want bool
	}{
		{"network", `<domain type='qemu'><name>a</name><devices><interface type='network'><source network='net1'/></interface></devices></domain>`, true},
		{"bridge of the network", `<domain type='qemu'><name>a</name><devices><interface type='bridge'><source bridge='caplbr'/></interface></devices></domain>`, true},
		{"other network", `<domain type='qemu'><name>a</name><devices><interface type='network'><source network='net2'/></interface></devices></domain>`, false},
		{"no devices", `<domain type='qemu'><name>a</name></domain>`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := interfaceUses(tt.doc, "net1", "caplbr")
			if err != nil || got != tt.want {
				t.Errorf("got %v, %v", got, err)
			}
		})
	}
}

func TestIsLocalURI(t *testing.T) {
	tests := []struct {
		uri  string
		want bool
	}{
		{"qemu:///system", true},
		{"qemu:///session", true},
		{"qemu+unix:///system", true},
		{"test:///default", true},
		{"qemu://localhost/system", true},
		{"qemu+ssh://root@host.example/system", false},
		{"qemu+tls://host.example:16514/system", false},
		{"qemu+ssh://localhost/system", false},
		{"qemu://host.example/system", false},
		{"garbage", false},
	}
	for _, tt := range tests {
		if got := isLocalURI(tt.uri); got != tt.want {
			t.Errorf("isLocalURI(%q) = %v", tt.uri, got)
		}
	}
}

func TestSameOwnerIgnoresUID(t *testing.T) {
	moved := testOwner
	moved.UID = "another"
	if !sameOwner(testOwner, moved) {
		t.Error("a moved owner (new UID) is not recognised")
	}
	other := testOwner
	other.Namespace = "prod"
	if sameOwner(testOwner, other) {
		t.Error("an owner in another namespace matched")
	}
}

func TestMergeReservations(t *testing.T) {
	a := Reservation{MAC: "52:54:00:00:00:0a", IP: netip.MustParseAddr("10.0.0.9")}
	b := Reservation{MAC: "52:54:00:00:00:0b", IP: netip.MustParseAddr("10.0.0.3")}
	got := mergeReservations([]Reservation{a}, []Reservation{b, {MAC: netalloc.CanonicalMAC("52:54:00:00:00:0A"), IP: a.IP}})
	if len(got) != 2 || got[0] != b || got[1] != a {
		t.Errorf("got %v", got)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
