package virt_test

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

// dhcpTestClient is a minimal DHCPv4 client that joins a libvirt network's
// bridge through a veth pair whose far end lives in a network namespace of
// its own. It lets the lease tests run in seconds instead of booting a
// guest for a minute under TCG. The namespace matters: from the root
// namespace the request would leave with one of the host's own addresses as
// source, and the bridge drops it as a martian.
type dhcpTestClient struct {
	fd     int
	mac    net.HardwareAddr
	server netip.Addr
}

// DHCP message types (RFC 2132, option 53).
const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5
	dhcpNak      = 6
	dhcpRelease  = 7
)

// newDHCPTestClient plugs a veth into bridge and opens the client's socket
// on its namespaced end, whose hardware address is mac. It needs root on
// the libvirt host itself; the test is skipped otherwise.
func newDHCPTestClient(t *testing.T, bridge string, mac net.HardwareAddr) *dhcpTestClient {
	t.Helper()
	if os.Geteuid() != 0 {
		testprereq.Missing(t, "the DHCP test client needs root to create a veth and a network namespace")
	}
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	host := "capltv" + hex.EncodeToString(suffix)
	peer := host + "p"
	la := netlink.NewLinkAttrs()
	la.Name = host
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peer, PeerHardwareAddr: mac}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("creating veth: %v", err)
	}
	// Deleting one end deletes the pair, wherever the other end lives.
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", bridge, err)
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		t.Fatalf("enslaving veth: %v", err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}

	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread is never unlocked: it dies with this goroutine, in
		// whatever namespace it ended up, and never runs other code.
		runtime.LockOSThread()
		fd, err := namespacedSocket(peer)
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = syscall.Close(r.fd) })
	return &dhcpTestClient{fd: r.fd, mac: mac}
}

// namespacedSocket moves peer into a new namespace and opens a UDP socket
// bound to it there; the socket keeps the namespace alive. Runs on a
// locked thread.
func namespacedSocket(peer string) (int, error) {
	orig, err := netns.Get()
	if err != nil {
		return -1, err
	}
	defer orig.Close()
	ns, err := netns.New() // switches this thread
	if err != nil {
		return -1, fmt.Errorf("new netns: %w", err)
	}
	defer ns.Close()
	if err := netns.Set(orig); err != nil {
		return -1, err
	}
	link, err := netlink.LinkByName(peer)
	if err != nil {
		return -1, err
	}
	if err := netlink.LinkSetNsFd(link, int(ns)); err != nil {
		return -1, fmt.Errorf("moving %s: %w", peer, err)
	}
	if err := netns.Set(ns); err != nil {
		return -1, err
	}
	if link, err = netlink.LinkByName(peer); err != nil {
		return -1, err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return -1, err
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, syscall.IPPROTO_UDP)
	if err != nil {
		return -1, err
	}
	setup := func() error {
		for _, o := range []int{syscall.SO_REUSEADDR, syscall.SO_BROADCAST} {
			if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, o, 1); err != nil {
				return err
			}
		}
		if err := syscall.BindToDevice(fd, peer); err != nil {
			return err
		}
		tv := syscall.NsecToTimeval(int64(time.Second))
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return syscall.Bind(fd, &syscall.SockaddrInet4{Port: 68})
	}
	if err := setup(); err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// message builds a DHCP request with the broadcast flag set, so the server
// answers by broadcast to an interface that has no address yet.
func (c *dhcpTestClient) message(xid uint32, typ byte, ciaddr netip.Addr, opts ...[]byte) []byte {
	b := make([]byte, 240)
	b[0], b[1], b[2] = 1, 1, 6 // BOOTREQUEST, Ethernet, 6-byte addresses
	binary.BigEndian.PutUint32(b[4:], xid)
	binary.BigEndian.PutUint16(b[10:], 0x8000)
	if ciaddr.IsValid() {
		a := ciaddr.As4()
		copy(b[12:], a[:])
	}
	copy(b[28:], c.mac)
	copy(b[236:], []byte{99, 130, 83, 99})
	b = append(b, 53, 1, typ)
	for _, o := range opts {
		b = append(b, o...)
	}
	return append(b, 255)
}

func dhcpOption(code byte, v []byte) []byte { return append([]byte{code, byte(len(v))}, v...) }

func ip4Bytes(a netip.Addr) []byte { x := a.As4(); return x[:] }

type dhcpReply struct {
	typ    byte
	yiaddr netip.Addr
	server netip.Addr
}

// exchange broadcasts msg until a reply of one of the wanted types with
// the same transaction arrives.
func (c *dhcpTestClient) exchange(xid uint32, msg []byte, want ...byte) (dhcpReply, error) {
	dst := &syscall.SockaddrInet4{Port: 67, Addr: [4]byte{255, 255, 255, 255}}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		if err := syscall.Sendto(c.fd, msg, 0, dst); err != nil {
			return dhcpReply{}, err
		}
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
			buf := make([]byte, 1500)
			n, _, err := syscall.Recvfrom(c.fd, buf, 0)
			if err != nil {
				break // receive timeout: send again
			}
			r, ok := parseDHCPReply(buf[:n], xid)
			if !ok {
				continue
			}
			for _, w := range want {
				if r.typ == w {
					return r, nil
				}
			}
		}
	}
	return dhcpReply{}, errors.New("no DHCP answer")
}

func parseDHCPReply(b []byte, xid uint32) (dhcpReply, bool) {
	if len(b) < 240 || b[0] != 2 || binary.BigEndian.Uint32(b[4:]) != xid {
		return dhcpReply{}, false
	}
	r := dhcpReply{yiaddr: netip.AddrFrom4([4]byte(b[16:20]))}
	for i := 240; i+1 < len(b) && b[i] != 255; {
		if b[i] == 0 {
			i++
			continue
		}
		code, l := b[i], int(b[i+1])
		if i+2+l > len(b) {
			break
		}
		v := b[i+2 : i+2+l]
		switch {
		case code == 53 && l == 1:
			r.typ = v[0]
		case code == 54 && l == 4:
			r.server = netip.AddrFrom4([4]byte(v))
		}
		i += 2 + l
	}
	return r, true
}

// acquire runs DISCOVER/OFFER/REQUEST/ACK and returns the leased address.
func (c *dhcpTestClient) acquire(hostname string) (netip.Addr, error) {
	xid := randomXID()
	name := dhcpOption(12, []byte(hostname))
	offer, err := c.exchange(xid, c.message(xid, dhcpDiscover, netip.Addr{}, name), dhcpOffer)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("discover: %w", err)
	}
	ack, err := c.exchange(xid, c.message(xid, dhcpRequest, netip.Addr{},
		dhcpOption(50, ip4Bytes(offer.yiaddr)), dhcpOption(54, ip4Bytes(offer.server)), name), dhcpAck, dhcpNak)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("request: %w", err)
	}
	if ack.typ == dhcpNak {
		return netip.Addr{}, fmt.Errorf("request for %s refused", offer.yiaddr)
	}
	c.server = offer.server
	return ack.yiaddr, nil
}

// release gives the lease back, as a guest's DHCP client does on a
// graceful shutdown.
func (c *dhcpTestClient) release(ip netip.Addr) error {
	xid := randomXID()
	msg := c.message(xid, dhcpRelease, ip, dhcpOption(54, ip4Bytes(c.server)))
	return syscall.Sendto(c.fd, msg, 0, &syscall.SockaddrInet4{Port: 67, Addr: [4]byte{255, 255, 255, 255}})
}

func randomXID() uint32 {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return binary.BigEndian.Uint32(b)
}
