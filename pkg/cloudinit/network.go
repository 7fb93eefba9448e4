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
	Type    string `json:"type"`
	Address string `json:"address,omitempty"`
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
