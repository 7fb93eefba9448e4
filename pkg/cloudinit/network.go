package cloudinit

import (
	"fmt"
	"net"
	"net/netip"

	"sigs.k8s.io/yaml"
)

// DHCPWithStaticAddress is a guest's NIC that takes its address from the
// LAN's DHCP server and also holds Static, a fixed address the guest
// serves on (the HAProxy VM's control-plane endpoint on a host bridge,
// where no DHCP server of ours can reserve it).
type DHCPWithStaticAddress struct {
	// MAC selects the NIC; cloud-init names it InterfaceName when the
	// kernel named it otherwise.
	MAC           string
	InterfaceName string
	Static        netip.Addr
}

// networkConfigV1 is cloud-init's network configuration, version 1: the
// version its ifupdown (ENI) renderer, which the capl images use, renders
// a static address next to DHCP from (as an alias interface).
type networkConfigV1 struct {
	Version int             `json:"version"`
	Config  []physicalNICV1 `json:"config"`
}

type physicalNICV1 struct {
	Type       string     `json:"type"`
	Name       string     `json:"name"`
	MACAddress string     `json:"mac_address"`
	Subnets    []subnetV1 `json:"subnets"`
}

type subnetV1 struct {
	Type           string   `json:"type"`
	Address        string   `json:"address,omitempty"`
	Gateway        string   `json:"gateway,omitempty"`
	DNSNameservers []string `json:"dns_nameservers,omitempty"`
}

// NetworkConfig returns the network-config document. The static address
// is a host route (/32, /128): the guest answers ARP for it on the LAN and
// reaches everything else through what DHCP gave it, so neither the LAN's
// prefix nor its gateway needs to be known.
func (n DHCPWithStaticAddress) NetworkConfig() ([]byte, error) {
	if _, err := net.ParseMAC(n.MAC); err != nil {
		return nil, fmt.Errorf("network-config: %w", err)
	}
	if n.InterfaceName == "" {
		return nil, fmt.Errorf("network-config: no interface name")
	}
	if !n.Static.IsValid() || n.Static.IsUnspecified() || n.Static.IsMulticast() || n.Static.IsLoopback() {
		return nil, fmt.Errorf("network-config: %v is not a unicast address a guest can hold", n.Static)
	}
	return yaml.Marshal(networkConfigV1{Version: 1, Config: []physicalNICV1{{
		Type: "physical", Name: n.InterfaceName, MACAddress: n.MAC,
		Subnets: []subnetV1{
			{Type: "dhcp"},
			{Type: "static", Address: netip.PrefixFrom(n.Static, n.Static.BitLen()).String()},
		},
	}}})
}

// StaticAddress is one address of a NIC configured without DHCP: the
// address with its network's prefix, and the gateway of that network
// (invalid for none).
type StaticAddress struct {
	Prefix  netip.Prefix
	Gateway netip.Addr
}

// StaticNIC is a guest's NIC whose addresses were handed out by an IPAM
// pool: no DHCP, each address with its prefix and gateway, and the DNS
// servers the machine names.
type StaticNIC struct {
	// MAC selects the NIC; cloud-init names it InterfaceName.
	MAC           string
	InterfaceName string
	Addresses     []StaticAddress
	Nameservers   []netip.Addr
}

// NetworkConfig returns the network-config document: one static subnet
// per address, the nameservers on the first.
func (n StaticNIC) NetworkConfig() ([]byte, error) {
	if _, err := net.ParseMAC(n.MAC); err != nil {
		return nil, fmt.Errorf("network-config: %w", err)
	}
	if n.InterfaceName == "" {
		return nil, fmt.Errorf("network-config: no interface name")
	}
	if len(n.Addresses) == 0 {
		return nil, fmt.Errorf("network-config: no address")
	}
	nic := physicalNICV1{Type: "physical", Name: n.InterfaceName, MACAddress: n.MAC}
	for _, a := range n.Addresses {
		if err := CheckStaticAddress(a); err != nil {
			return nil, fmt.Errorf("network-config: %w", err)
		}
		subnet := subnetV1{Type: "static", Address: a.Prefix.String()}
		if a.Gateway.IsValid() {
			subnet.Gateway = a.Gateway.String()
		}
		nic.Subnets = append(nic.Subnets, subnet)
	}
	for _, ns := range n.Nameservers {
		nic.Subnets[0].DNSNameservers = append(nic.Subnets[0].DNSNameservers, ns.String())
	}
	return yaml.Marshal(networkConfigV1{Version: 1, Config: []physicalNICV1{nic}})
}

// CheckStaticAddress refuses an address a guest cannot hold as its own
// (the network's or the broadcast address aside, which only the pool
// knows), and a gateway outside the address's network or equal to it.
func CheckStaticAddress(a StaticAddress) error {
	ip := a.Prefix.Addr()
	if !a.Prefix.IsValid() || !ip.IsGlobalUnicast() {
		return fmt.Errorf("%v is not a unicast address a guest can hold", a.Prefix)
	}
	if !a.Gateway.IsValid() {
		return nil
	}
	if a.Gateway.Is4() != ip.Is4() || !a.Prefix.Masked().Contains(a.Gateway) || a.Gateway == ip {
		return fmt.Errorf("gateway %v is not another address of %v", a.Gateway, a.Prefix.Masked())
	}
	return nil
}
