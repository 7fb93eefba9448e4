package virt_test

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The shared segment of TestCleanTrafficDropsSpoofedARP: a bridge with no
// uplink in the benchmark range (RFC 2544), which no LAN uses, and the
// address the guest claims that is not its own.
const (
	sharedGateway = "198.18.231.1"
	sharedPrefix  = "/24"
	sharedRange   = "198.18.231.10,198.18.231.20"
	spoofedIP     = "198.18.231.99"
)

// ipFile is where the guest's user-data writes its address once it has one.
const ipFile = "/run/capl-ip"

// arpSpoofer, run with python3 in the guest, sends ARP replies from the
// guest's own MAC claiming the address in argv[1] and, as a control, its
// own address in argv[2], three times each.
const arpSpoofer = `
import socket, struct, sys, time
ifname = [n for _, n in socket.if_nameindex() if n != "lo"][0]
mac = bytes.fromhex(open("/sys/class/net/%s/address" % ifname).read().strip().replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
def reply(ip):
    a = socket.inet_aton(ip)
    return b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) + mac + a + b"\xff" * 6 + a
for _ in range(3):
    for ip in sys.argv[1:3]:
        s.send(reply(ip))
    time.sleep(0.2)
`

// TestCleanTrafficDropsSpoofedARP boots a guest on a shared host bridge
// (its DHCP served by a dnsmasq of the test, as a home router would) with
// the NIC filter the provider gives machines on shared segments, and has it
// send ARP replies claiming another host's address and its own. On the
// bridge the host sees its own and never the spoofed one. Without the
// filter both arrive (the check fails on the domain XML before the filter).
func TestCleanTrafficDropsSpoofedARP(t *testing.T) {
	img := testlibvirt.Image(t)
	e := newStorageEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	bridge := sharedBridge(t)

	base, err := e.c.ImportImage(ctx, virt.ImageImport{Pool: e.pool, Volume: e.pool + "-base.qcow2", Source: img, Policy: testlibvirt.FilePolicy(img), SHA256: fileSHA(t, img)})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := e.c.EnsureOverlay(ctx, virt.OverlaySpec{Pool: e.pool, Name: e.pool + "-disk.qcow2", BackingPool: e.pool, BackingVolume: base.Name, CapacityBytes: 3 << 30})
	if err != nil {
		t.Fatal(err)
	}
	domUUID := uuid.NewString()
	// runcmd may run before the bridge's DHCP answered on a loaded host:
	// wait for the address, and write the file whole once there is one.
	userData := "#cloud-config\nruncmd:\n- [sh, -c, 'for i in $(seq 300); do a=$(ip -4 -o addr show scope global); [ -n \"$a\" ] && break; sleep 1; done; echo \"$a\" > " + ipFile + ".new; mv " + ipFile + ".new " + ipFile + "']\n"
	iso, err := cloudinit.BuildISO(cloudinit.Seed{InstanceID: domUUID, LocalHostname: e.pool, UserData: []byte(userData)})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := e.c.UploadVolume(ctx, e.pool, e.pool+"-seed.iso", iso)
	if err != nil {
		t.Fatal(err)
	}
	hw, err := testlibvirt.NewMAC()
	if err != nil {
		t.Fatal(err)
	}
	name := e.pool + "-vm"
	t.Cleanup(func() {
		if err := e.c.DeleteDomain(context.Background(), name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	spec := virt.DomainSpec{
		Name: name, UUID: domUUID,
		Owner: virt.Owner{Kind: "LibvirtMachine", Namespace: "capltest", Name: name, UID: uuid.NewString()},
		Type:  virt.DomainTypeQEMU, CPUMode: virt.CPUModeMaximum, VCPUs: 1, MemoryMiB: 512, TCGCacheMiB: 128,
		DiskPath: disk.Path, DiskBackingPath: disk.BackingPath, DiskBackingFormat: disk.BackingFormat,
		SeedISOPath: seed.Path, Bridge: bridge, MAC: netalloc.CanonicalMAC(hw.String()), TrafficFilter: virt.CleanTrafficFilter,
	}
	if _, err := e.c.EnsureDomain(ctx, spec); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := e.c.StartDomain(ctx, name); err != nil {
		t.Fatal(err)
	}
	addr := strings.Fields(string(waitGuestFile(t, e.c, name, ipFile, 8*time.Minute)))
	if len(addr) < 4 {
		t.Fatalf("the guest wrote no address: %q", addr)
	}
	own, _, err := net.ParseCIDR(addr[3])
	if err != nil {
		t.Fatalf("guest address %q: %v", addr[3], err)
	}
	t.Logf("start → guest has %s from the bridge's DHCP: %v", own, time.Since(start).Round(time.Second))

	seen := captureARP(t, bridge, func() {
		res, err := e.c.GuestExec(ctx, name, "python3", []string{"-c", arpSpoofer, spoofedIP, own.String()}, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("sending ARP in the guest: %v %+v %s", err, res, res.Stderr)
		}
	})
	t.Logf("ARP replies from the guest's MAC seen on %s, by sender address: %v", bridge, seen)
	if seen[own.String()] == 0 {
		t.Fatalf("the guest's own ARP replies never reached the bridge: the capture proves nothing")
	}
	if n := seen[spoofedIP]; n > 0 {
		t.Errorf("%d ARP replies claiming %s, not the guest's address, reached the bridge", n, spoofedIP)
	}
}

// sharedBridge makes a host bridge with an address and a dnsmasq serving
// DHCP on it, removed with the test.
func sharedBridge(t *testing.T) string {
	t.Helper()
	name := "capltbr" + strings.TrimPrefix(testlibvirt.Name(t), "capltest-")
	if len(name) > 15 {
		name = name[:15]
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("link", "add", "name", name, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	run("addr", "add", sharedGateway+sharedPrefix, "dev", name)
	run("link", "set", name, "up")
	dir := t.TempDir()
	dnsmasq := exec.Command("dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--port=0",
		"--interface="+name, "--bind-interfaces", "--except-interface=lo", "--dhcp-range="+sharedRange+",1h",
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--pid-file="+filepath.Join(dir, "pid"))
	dnsmasq.Stdout, dnsmasq.Stderr = os.Stderr, os.Stderr
	if err := dnsmasq.Start(); err != nil {
		t.Fatalf("dnsmasq: %v", err)
	}
	t.Cleanup(func() {
		_ = dnsmasq.Process.Kill()
		_ = dnsmasq.Wait()
	})
	return name
}

// captureARP counts the ARP frames on iface, by sender address, from just
// before send runs until two seconds after.
func captureARP(t *testing.T, iface string, send func()) map[string]int {
	t.Helper()
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	proto := htons(unix.ETH_P_ARP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
	if err != nil {
		t.Fatalf("capture socket: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	send()
	seen := map[string]int{}
	buf := make([]byte, 1500)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < 42 {
			continue
		}
		// Ethernet (14) + ARP: sender IP at 14+14.
		if binary.BigEndian.Uint16(buf[20:22]) == 2 {
			seen[net.IP(buf[28:32]).String()]++
		}
	}
	return seen
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
