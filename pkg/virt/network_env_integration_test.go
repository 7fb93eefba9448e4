package virt_test

import (
	"net/netip"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// networkEnv is a client plus a raw connection the assertions use, so they
// do not trust the code under test.
type networkEnv struct {
	uri  string
	c    *virt.Client
	conn *libvirt.Connect
}

func newNetworkEnv(t *testing.T) networkEnv {
	t.Helper()
	uri := testlibvirt.URI(t)
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Close() })
	return networkEnv{uri: uri, c: testlibvirt.Client(t, uri), conn: conn}
}

// ensure creates a managed test network and removes it when t ends.
func (e networkEnv) ensure(t *testing.T, spec virt.NetworkSpec) virt.NetworkInfo {
	t.Helper()
	e.cleanupNetwork(t, spec.Name)
	info, err := e.c.EnsureNetwork(testCtx(t), spec)
	if err != nil {
		t.Fatalf("EnsureNetwork(%s): %v", spec.Name, err)
	}
	return info
}

func testNetworkSpec(t *testing.T) virt.NetworkSpec {
	name := testlibvirt.Name(t)
	return virt.NetworkSpec{Name: name, Owner: virt.Owner{Kind: "LibvirtCluster", Namespace: "capltest", Name: name, UID: "uid-" + name, Cluster: name}}
}

// cleanupNetwork destroys and undefines a test network when t ends, with
// the raw connection.
func (e networkEnv) cleanupNetwork(t *testing.T, name string) {
	t.Helper()
	if !strings.HasPrefix(name, virt.TestNamePrefix) {
		t.Fatalf("refusing to clean up non-test network %q", name)
	}
	t.Cleanup(func() {
		net, err := e.conn.LookupNetworkByName(name)
		if err != nil {
			if !virt.IsNotFound(err) {
				t.Errorf("cleanup: looking up network %s: %v", name, err)
			}
			return
		}
		defer net.Free()
		if active, _ := net.IsActive(); active {
			if err := net.Destroy(); err != nil {
				t.Errorf("cleanup: destroying network %s: %v", name, err)
			}
		}
		if persistent, _ := net.IsPersistent(); persistent {
			if err := net.Undefine(); err != nil {
				t.Errorf("cleanup: undefining network %s: %v", name, err)
			}
		}
	})
}

// defineRaw defines a network that is not ours (no metadata) and leaves it
// inactive.
func (e networkEnv) defineRaw(t *testing.T, name string, subnet netip.Prefix) {
	t.Helper()
	e.cleanupNetwork(t, name)
	def := libvirtxml.Network{
		Name:   name,
		Bridge: &libvirtxml.NetworkBridge{Name: netalloc.BridgeName(name)},
		IPs:    []libvirtxml.NetworkIP{{Address: netalloc.Gateway(subnet).String(), Prefix: uint(subnet.Bits())}},
	}
	doc, err := def.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	net, err := e.conn.NetworkDefineXML(doc)
	if err != nil {
		t.Fatalf("defining %s: %v", name, err)
	}
	_ = net.Free()
}

// xml returns a network's live or persistent definition.
func (e networkEnv) xml(t *testing.T, name string, flags libvirt.NetworkXMLFlags) libvirtxml.Network {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	doc, err := net.GetXMLDesc(flags)
	if err != nil {
		t.Fatal(err)
	}
	var x libvirtxml.Network
	if err := x.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	return x
}

// hosts returns the DHCP host entries of both definitions.
func (e networkEnv) hosts(t *testing.T, name string) (live, config []libvirtxml.NetworkDHCPHost) {
	t.Helper()
	get := func(flags libvirt.NetworkXMLFlags) []libvirtxml.NetworkDHCPHost {
		x := e.xml(t, name, flags)
		if len(x.IPs) == 0 || x.IPs[0].DHCP == nil {
			return nil
		}
		return x.IPs[0].DHCP.Hosts
	}
	return get(0), get(libvirt.NETWORK_XML_INACTIVE)
}

func (e networkEnv) state(t *testing.T, name string) (exists, active, autostart bool) {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if virt.IsNotFound(err) {
		return false, false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	active, _ = net.IsActive()
	autostart, _ = net.GetAutostart()
	return true, active, autostart
}

func (e networkEnv) destroy(t *testing.T, name string) {
	t.Helper()
	net, err := e.conn.LookupNetworkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Free()
	if err := net.Destroy(); err != nil {
		t.Fatal(err)
	}
}
