// Package segment decides whether a VM may take a MAC or a static address
// on the segment its NIC joins (a libvirt network or a host bridge), from
// what libvirt says, never from what a tenant wrote: the host's own
// addresses there, a libvirt network's DHCP ranges, host entries and
// leases, and the MACs and recorded static addresses of every domain on
// that segment, of any namespace, on every libvirt host the manager
// reaches (a host bridge of one name is taken for one LAN across hosts).
// The address and IPAM steps run these checks before anything of the VM
// exists in libvirt.
package segment

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// MACCandidates is how many MACs the provider derives from a domain UUID
// (naming.MACCandidates): a MAC among them is the provider's own choice.
const MACCandidates = 8

// recheck is how often a refused VM looks again: the holder may go.
const recheck = time.Minute

// Hosts are the other libvirt hosts the manager reaches that answer now
// (the VM's own host may be among them); nil for none.
type Hosts func() []virt.NetworkHost

// Checker reads a VM's segment on its host and on the others.
type Checker struct {
	vm     *scope.VM
	host   virt.NetworkHost
	others Hosts
}

// New returns the checker of vm, placed on host.
func New(vm *scope.VM, host virt.NetworkHost, others Hosts) *Checker {
	return &Checker{vm: vm, host: host, others: others}
}

// view is a segment as the hosts report it: local is the VM's host's,
// remote the other hosts' (only their bridges' own addresses and their
// domains count: a libvirt network of one name on two hosts is two).
type view struct {
	local  virt.SegmentUse
	remote []virt.SegmentUse
}

// read lists the segment; a host other than the VM's that fails to answer
// is left out (the VM's own must answer).
func (c *Checker) read(ctx context.Context) (view, error) {
	n := c.vm.Network
	var v view
	var err error
	if v.local, err = c.host.SegmentUse(ctx, n.Name, n.Bridge); err != nil {
		if virt.IsNotFound(err) {
			return v, services.Fail(infrav1.WaitingForNetworkReason, services.Requeue(recheck, "network missing"), "Network %s does not exist", n.Name)
		}
		return v, services.Fail(infrav1.LibvirtErrorReason, err, "Reading who holds addresses on %s: %v", n, err)
	}
	if c.others == nil {
		return v, nil
	}
	for _, h := range c.others() {
		if h == c.host {
			continue
		}
		use, err := h.SegmentUse(ctx, n.Name, n.Bridge)
		if err != nil {
			continue // not answering, or no such network there
		}
		if n.Name != "" {
			use.Own = nil // another host's network of that name is another segment
		}
		v.remote = append(v.remote, use)
	}
	return v, nil
}

// domains are the segment's domains on every host read.
func (v view) domains() []virt.SegmentDomain {
	out := slices.Clone(v.local.Domains)
	for _, r := range v.remote {
		out = append(out, r.Domains...)
	}
	return out
}

// Derived tells whether mac is one the provider derives from the domain
// UUID uuid.
func Derived(uuid string, mac netalloc.MAC) bool {
	return uuid != "" && slices.Contains(naming.MACCandidates(uuid, MACCandidates), mac.Canonical())
}

// CheckMAC refuses the VM's MAC (AddressReserved MACNotOwned) when
// another domain on the segment, of any owner but the VM's object, uses
// it; or when the provider did not derive it from the VM's domain UUID
// and the VM's own domain, by its ownership metadata, does not use it
// already (a MAC a tenant wrote into an annotation).
func (c *Checker) CheckMAC(ctx context.Context) error {
	vm := c.vm
	mac := vm.MAC.Canonical()
	v, err := c.read(ctx)
	if err != nil {
		return err
	}
	ownUses := false
	for _, d := range v.domains() {
		if !slices.Contains(d.MACs, mac) {
			continue
		}
		if !d.Owner.IsObject(vm.Owner) {
			return services.Fail(infrav1.MACNotOwnedReason, services.Requeue(recheck, "MAC used by another domain"),
				"MAC %s is used by another domain on %s (not this %s's): choose no MAC, the provider derives one", mac, vm.Network, vm.Owner.Kind)
		}
		if d.Name == vm.Domain {
			ownUses = true
		}
	}
	if !Derived(vm.UUID, mac) && !ownUses {
		return services.Fail(infrav1.MACNotOwnedReason, services.Requeue(0, "MAC not derived"),
			"MAC %s was not derived by the provider from domain UUID %s and no domain of this %s uses it: remove the MAC annotation, the provider derives one", mac, vm.UUID, vm.Owner.Kind)
	}
	return nil
}

// CheckAddresses refuses a static address (AddressReserved AddressInUse)
// that is the host's own or the network's gateway on the segment, lies in
// a libvirt network's DHCP range, is reserved or leased there for another
// MAC, or is held statically by another domain on the segment, of any
// namespace, on any host the manager reaches.
func (c *Checker) CheckAddresses(ctx context.Context, addrs []netip.Addr) error {
	v, err := c.read(ctx)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if why := v.holder(a, c.vm); why != "" {
			return services.Fail(infrav1.AddressInUseReason, services.Requeue(recheck, "address in use"),
				"%s on %s %s: the pool must hand out an address nobody else on the segment holds", a, c.vm.Network, why)
		}
	}
	return nil
}

// holder says who holds a on the segment besides vm; "" for nobody.
func (v view) holder(a netip.Addr, vm *scope.VM) string {
	a = a.Unmap()
	own := slices.Clone(v.local.Own)
	for _, r := range v.remote {
		own = append(own, r.Own...)
	}
	if slices.Contains(own, a) {
		return "is the libvirt host's own address there (the network's gateway or the bridge's address)"
	}
	for _, r := range v.local.DHCPRanges {
		if r.Contains(a) {
			return fmt.Sprintf("lies in the network's DHCP range %s–%s", r.Start, r.End)
		}
	}
	mac := vm.MAC.Canonical()
	for _, e := range v.local.Reservations {
		if e.IP == a && e.MAC != mac {
			return fmt.Sprintf("is reserved in the network's DHCP server for MAC %s", e.MAC)
		}
	}
	now := time.Now()
	for _, l := range v.local.Leases {
		if l.IP.Unmap() == a && l.MAC != mac && (l.Expiry.IsZero() || l.Expiry.After(now)) {
			return fmt.Sprintf("is leased by the network's DHCP server to MAC %s", l.MAC)
		}
	}
	for _, d := range v.domains() {
		if !d.Owner.IsObject(vm.Owner) && slices.Contains(d.Addresses, a) {
			return "is held by another VM on the segment"
		}
	}
	return ""
}
