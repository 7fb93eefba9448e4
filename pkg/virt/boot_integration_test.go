package virt_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// bootSentinel is the file CAPI bootstrap providers write when the node's
// bootstrap finished; controllers read it through the guest agent.
const bootSentinel = "/run/cluster-api/bootstrap-success.complete"

// TestBootGuestThroughReservedLease boots the test image with the engine
// alone and proves, with a real guest: the overlay on an imported base, the
// NoCloud ISO (cloud-init finds kdomanski's file names, reads meta-data's
// instance-id and local-hostname and runs user-data), the reservation (the
// guest's lease is the reserved IP, announced by a lease event) and the
// guest-agent path (the sentinel file, the SMBIOS UUID and the hostname are
// read through it). Under TCG it takes 2-3 minutes.
func TestBootGuestThroughReservedLease(t *testing.T) {
	testlibvirt.SoakOnly(t, "every machine of the e2e's cluster boots through its reserved lease, and the suite compares the guest's own addresses with status.addresses")
	img := testlibvirt.Image(t)
	e := newNetworkEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	pool := testlibvirt.Pool(t, e.uri, e.c)
	hostname := pool // a valid DNS label, and recognisably ours

	begin := time.Now()
	base, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: pool, Volume: pool + "-base.qcow2", Source: img, Policy: testlibvirt.FilePolicy(img), SHA256: fileSHA(t, img)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image imported in %v", time.Since(begin).Round(time.Millisecond))

	netSpec := testNetworkSpec(t)
	network := e.ensure(t, netSpec)
	hw, err := testlibvirt.NewMAC()
	if err != nil {
		t.Fatal(err)
	}
	mac := netalloc.CanonicalMAC(hw.String())
	ip, err := e.c.ReserveAddress(ctx, netSpec.Name, virt.Reservation{MAC: mac, Hostname: hostname})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.ReleaseAddress(context.Background(), netSpec.Name, mac) })

	disk, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: pool, Name: pool + "-disk.qcow2", BackingPool: pool,
		BackingVolume: base.Name, CapacityBytes: 3 << 30})
	if err != nil {
		t.Fatal(err)
	}

	domUUID := uuid.NewString()
	token := randomToken(t)
	iso, err := cloudinit.BuildISO(cloudinit.Seed{InstanceID: domUUID, LocalHostname: hostname, UserData: bootUserData(token)})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := e.c.UploadVolume(ctx, pool, pool+"-seed.iso", iso)
	if err != nil {
		t.Fatal(err)
	}

	name := pool + "-vm"
	spec := virt.DomainSpec{
		Name:        name,
		UUID:        domUUID,
		Owner:       virt.Owner{Kind: "LibvirtMachine", Namespace: "capltest", Name: name, UID: uuid.NewString(), Cluster: netSpec.Name},
		Type:        virt.DomainTypeQEMU,
		CPUMode:     virt.CPUModeMaximum,
		VCPUs:       1,
		MemoryMiB:   512,
		TCGCacheMiB: 128,
		DiskPath:    disk.Path, DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat,
		SeedISOPath:    seed.Path,
		Network:        network.Name,
		MAC:            mac,
		ConsoleLogPath: virt.DefaultConsoleLogPath(name),
	}
	t.Cleanup(func() {
		if err := e.c.DeleteDomain(context.Background(), name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	step := time.Now()
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("domain defined in %v", time.Since(step).Round(time.Millisecond))

	events := e.c.Subscribe(ctx)
	if err := e.c.WatchLease(ctx, netSpec.Name, mac); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := e.c.StartDomain(ctx, name); err != nil {
		t.Fatal(err)
	}

	lease := waitBootLease(t, events, name, mac, 6*time.Minute)
	t.Logf("start → lease event: %v (IP %s)", time.Since(start).Round(time.Second), lease.IP)
	if lease.IP != ip.String() {
		t.Fatalf("guest leased %s, but %s was reserved for it", lease.IP, ip)
	}

	content := waitGuestFile(t, e.c, name, bootSentinel, 8*time.Minute)
	t.Logf("start → sentinel: %v", time.Since(start).Round(time.Second))
	if strings.TrimSpace(string(content)) != token {
		t.Fatalf("sentinel holds %q, want %q", content, token)
	}

	// meta-data reached the guest: SMBIOS UUID = instance-id = domain UUID
	// is what providerID relies on, and local-hostname became the hostname.
	productUUID, err := e.c.GuestReadFile(ctx, name, "/sys/class/dmi/id/product_uuid")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.EqualFold(strings.TrimSpace(string(productUUID)), domUUID) {
		t.Fatalf("product_uuid %q, want %s", productUUID, domUUID)
	}
	instanceID, err := e.c.GuestReadFile(ctx, name, "/var/lib/cloud/data/instance-id")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(instanceID)) != domUUID {
		t.Fatalf("cloud-init instance-id %q, want %s", instanceID, domUUID)
	}
	gotHostname, err := e.c.GuestReadFile(ctx, name, "/proc/sys/kernel/hostname")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(gotHostname)) != hostname {
		t.Fatalf("guest hostname %q, want %q from meta-data", gotHostname, hostname)
	}

	addrs, err := e.c.Addresses(ctx, virt.AddressQuery{Domain: name, Network: netSpec.Name, MAC: netalloc.MAC(strings.ToUpper(mac.String()))})
	if err != nil || len(addrs) == 0 || addrs[0].IP != ip || addrs[0].Source != virt.AddressSourceLease {
		t.Fatalf("Addresses: %+v, %v", addrs, err)
	}

	// A graceful shutdown lets the guest's DHCP client release its lease,
	// so its IP can be pinned to another MAC at once (see
	// TestLeaseEventsAndStaleLease for a machine that is destroyed).
	stop := time.Now()
	if err := e.c.ShutdownDomain(ctx, name, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := leaseGone(e.conn, netSpec.Name, mac, 30*time.Second); err != nil {
		t.Errorf("after a graceful shutdown (%v): %v; the guest's DHCP client did not release its lease", time.Since(stop).Round(time.Second), err)
	} else {
		t.Logf("graceful shutdown took %v; the guest released its lease", time.Since(stop).Round(time.Second))
	}

	step = time.Now()
	if err := e.c.DeleteDomain(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("domain deleted in %v", time.Since(step).Round(time.Millisecond))
	for _, v := range []string{disk.Name, seed.Name} {
		if err := e.c.DeleteVolume(ctx, pool, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.c.ReleaseAddress(ctx, netSpec.Name, mac); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DeleteNetwork(ctx, netSpec.Name); err != nil {
		t.Fatal(err)
	}
	if err := e.c.DeleteVolume(ctx, pool, base.Name); err != nil {
		t.Fatal(err)
	}
	testlibvirt.AssertNothingOwned(t, e.uri)
}

// bootUserData writes the sentinel in runcmd, i.e. in cloud-init's final
// stage, as a bootstrap provider's script does when it is done.
func bootUserData(token string) []byte {
	return []byte(`#cloud-config
runcmd:
  - [sh, -c, "mkdir -p /run/cluster-api && echo ` + token + ` > ` + bootSentinel + `"]
`)
}

func randomToken(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "capltest-" + hex.EncodeToString(b)
}

// waitBootLease waits for the lease event of mac, failing fast when the
// domain stops or crashes instead.
func waitBootLease(t *testing.T, events <-chan virt.Event, domain string, mac netalloc.MAC, timeout time.Duration) virt.Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("event channel closed")
			}
			switch {
			case ev.Kind == virt.EventLease && ev.MAC == mac:
				return ev
			case ev.Domain == domain && (ev.Kind == virt.EventDomainCrashed || ev.Kind == virt.EventDomainStopped):
				t.Fatalf("domain %s: %s (%s) before its lease", domain, ev.Kind, ev.Detail)
			}
		case <-deadline:
			t.Fatalf("no lease for %s within %v", mac, timeout)
		}
	}
}

// waitGuestFile polls a guest file through the guest agent until it exists.
func waitGuestFile(t *testing.T, c virt.Host, domain, path string, timeout time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b, err := c.GuestReadFile(ctx, domain, path)
		cancel()
		if err == nil {
			return b
		}
		last = err
		time.Sleep(5 * time.Second)
	}
	t.Fatalf("%s did not appear in %s within %v (last error: %v)", path, domain, timeout, last)
	return nil
}

// leaseGone waits up to wait for the DHCP lease of mac on network to
// disappear, reading the leases through conn (not through the engine under
// test), and says what it last saw when it does not.
func leaseGone(conn *libvirt.Connect, network string, mac netalloc.MAC, wait time.Duration) error {
	n, err := conn.LookupNetworkByName(network)
	if err != nil {
		return err
	}
	defer n.Free()
	for deadline := time.Now().Add(wait); ; time.Sleep(time.Second) {
		leases, err := n.GetDHCPLeases()
		if err != nil {
			return err
		}
		var held []string
		for _, l := range leases {
			if netalloc.CanonicalMAC(l.Mac) == mac {
				held = append(held, l.IPaddr)
			}
		}
		if len(held) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still holds a lease of %v after %v", mac, held, wait)
		}
	}
}
