//go:build e2e

package e2e

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The report's arithmetic is pure; these table tests pin it down without
// any VM.

// The suite's checks are pure functions too where they can be; these pin
// them down without a plane.

func TestGuestAddresses(t *testing.T) {
	// Shaped like `ip -j addr show` of iproute2 6.1 in the test image.
	ipJSON := []byte(`[
 {"ifindex":1,"ifname":"lo","link_type":"loopback","address":"00:00:00:00:00:00","addr_info":[
   {"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"},{"family":"inet6","local":"::1","prefixlen":128,"scope":"host"}]},
 {"ifindex":2,"ifname":"ens3","link_type":"ether","address":"52:54:00:ab:cd:ef","addr_info":[
   {"family":"inet","local":"192.168.150.23","prefixlen":24,"scope":"global","dynamic":true},
   {"family":"inet6","local":"fe80::5054:ff:feab:cdef","prefixlen":64,"scope":"link"}]},
 {"ifindex":3,"ifname":"ens4","link_type":"ether","address":"52:54:00:00:00:01","addr_info":[
   {"family":"inet","local":"10.0.0.5","prefixlen":24,"scope":"global"}]}
]`)
	internal := func(ips ...string) []clusterv1.MachineAddress {
		var out []clusterv1.MachineAddress
		for _, ip := range ips {
			out = append(out, clusterv1.MachineAddress{Type: clusterv1.MachineInternalIP, Address: ip})
		}
		return append(out, clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: "cp-0"})
	}
	tests := []struct {
		name    string
		mac     string
		status  []clusterv1.MachineAddress
		wantErr string
	}{
		{"status matches the guest's interface with the MAC", "52:54:00:AB:CD:EF", internal("192.168.150.23"), ""},
		{"another guest interface's address", "52:54:00:ab:cd:ef", internal("10.0.0.5"), "but the guest has [192.168.150.23]"},
		{"an address the guest does not have", "52:54:00:ab:cd:ef", internal("192.168.150.23", "192.168.150.24"), "but the guest has"},
		{"no InternalIP", "52:54:00:ab:cd:ef", internal(), "InternalIP addresses []"},
		{"no interface with the MAC", "52:54:00:99:99:99", internal("192.168.150.23"), "no interface with MAC"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			guest, err := guestIPv4(ipJSON, tt.mac)
			if err == nil {
				_, err = sameAsGuest(tt.status, guest)
			}
			if got := errString(err); tt.wantErr == "" && got != "" || !strings.Contains(got, tt.wantErr) {
				t.Errorf("error %q, want one containing %q", got, tt.wantErr)
			}
		})
	}
	if _, err := guestIPv4([]byte("not json"), "52:54:00:ab:cd:ef"); err == nil {
		t.Error("unparsable output accepted")
	}
}

func TestRunObjects(t *testing.T) {
	owned := &virt.Owner{Kind: "LibvirtMachine", Namespace: namespace, Name: "renamed"}
	image := testlibvirt.ImageVolumePrefix + "0123"
	objs := []testlibvirt.Object{
		{Kind: testlibvirt.KindDomain, Name: runPrefix + "cp-0"},                             // 0: named for the run
		{Kind: testlibvirt.KindDomain, Name: "stray", Owner: owned},                          // 1: owned, named otherwise
		{Kind: testlibvirt.KindDomain, Name: "capl-other.cp-0"},                              // 2: another namespace
		{Kind: testlibvirt.KindNetwork, Name: runPrefix + "e2e"},                             // 3
		{Kind: testlibvirt.KindPool, Name: e2ePool},                                          // 4: the run's pool
		{Kind: testlibvirt.KindFile, Pool: poolRoot, Name: e2ePool, Dir: poolRoot},           // 5: its directory
		{Kind: testlibvirt.KindVolume, Pool: e2ePool, Name: image},                           // 6: a base image of the run's pool
		{Kind: testlibvirt.KindVolume, Pool: e2ePool, Name: image + ".partial"},              // 7: an import marker there
		{Kind: testlibvirt.KindFile, Pool: e2ePool, Name: "stray.qcow2"},                     // 8: a file behind libvirt's back
		{Kind: testlibvirt.KindVolume, Pool: "capi-libvirt", Name: image},                    // 9: a base image there before the run
		{Kind: testlibvirt.KindVolume, Pool: "capi-libvirt", Name: image + "ff"},             // 10: one that appeared during the run
		{Kind: testlibvirt.KindVolume, Pool: "capi-libvirt", Name: "user.qcow2"},             // 11: not ours
		{Kind: testlibvirt.KindVolume, Pool: virt.TestNamePrefix + "abc", Name: image + "1"}, // 12: an integration test's
	}
	before := imagesBefore(objs[9:10])
	pick := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, objs[i].String())
		}
		return out
	}
	for _, tt := range []struct {
		name string
		sc   leakScope
		want []string
	}{
		{"while clusters exist: base images and the pool are expected, markers are not", whileClusters, pick(0, 1, 3, 7, 8)},
		{"after down: everything of the run, and base images new anywhere", afterDown, pick(0, 1, 3, 4, 5, 6, 7, 8, 10)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := names(runObjects(objs, tt.sc, before)); !slices.Equal(got, tt.want) {
				t.Errorf("runObjects =\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

func TestMachineObjects(t *testing.T) {
	domain := naming.DomainName(namespace, "x-kill-1")
	objs := []testlibvirt.Object{
		{Kind: testlibvirt.KindDomain, Name: domain},
		{Kind: testlibvirt.KindDomain, Name: "capl-e2e.elsewhere", Owner: &virt.Owner{Kind: "LibvirtMachine", Namespace: namespace, Name: "x-kill-1"}},
		{Kind: testlibvirt.KindDomain, Name: naming.DomainName(namespace, "x-kill-10")},
		{Kind: testlibvirt.KindVolume, Pool: e2ePool, Name: domain + "-root.qcow2"},
		{Kind: testlibvirt.KindFile, Pool: e2ePool, Name: domain + "-seed.iso"},
		{Kind: testlibvirt.KindVolume, Pool: e2ePool, Name: naming.DomainName(namespace, "x-kill-10") + "-root.qcow2"},
	}
	domains, volumes := machineObjects(objs, "x-kill-1")
	if got, want := names(domains), names(objs[0:2]); !slices.Equal(got, want) {
		t.Errorf("domains %v, want %v", got, want)
	}
	if got, want := names(volumes), names(objs[3:5]); !slices.Equal(got, want) {
		t.Errorf("volumes %v, want %v", got, want)
	}
}

// TestTeardownSweepsOnItsOwnConnection runs the teardown's sweep and final
// check against the real libvirtd with the suite's client closed (nil), as
// on a failed run: they must find and remove a leftover of the run (a
// network without metadata, which ListOwned would not see) on connections
// of their own.
func TestTeardownSweepsOnItsOwnConnection(t *testing.T) {
	uri := os.Getenv(envURI)
	if uri == "" {
		t.Skipf("%s not set", envURI)
	}
	// The test sweeps the run's namespace: never beside a running suite.
	s := &suite{t: t, uri: uri}
	if _, err := s.claimHost(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.releaseHost)
	name := runPrefix + "zz-teardown-test"
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	n, err := conn.NetworkDefineXML("<network><name>" + name + "</name></network>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Undefine(); _ = n.Free() })

	var order []string
	objs, err := s.hostObjects()
	if err != nil {
		t.Fatal(err)
	}
	s.imagesBefore = imagesBefore(objs)
	inOrder(
		func() {
			swept, err := s.sweepOurs(context.Background(), false)
			if err != nil {
				t.Error(err)
			}
			order = append(order, "sweep "+strings.Join(swept, ","))
			order = append(order, "left "+strings.Join(s.ourLibvirtObjects(afterDown), ","))
		},
		func() { order = append(order, "close") },
	)()
	want := []string{"sweep network " + name, "left ", "close"}
	if !slices.Equal(order, want) {
		t.Errorf("teardown did %q, want %q", order, want)
	}
}

// TestReportCarriesGuestsLine: the report's markdown names the guests it counted.
func TestReportCarriesGuestsLine(t *testing.T) {
	r := newReport()
	r.addGuest(guestSize("machine", infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum}))
	r.HostCores = 2
	if md, want := r.markdown(), guestsLine(r.Guests, r.HostCores); !strings.Contains(md, want) {
		t.Errorf("the report does not carry the guests line %q:\n%s", want, md)
	}
}
