// Package netalloc makes the addressing decisions for the guest networks the
// provider creates: which CIDR a new network gets, its gateway and DHCP range,
// which address a guest is pinned to, which MAC a NIC gets, and what the
// host's bridge is called.
//
// Everything here is IPv4 only (guest networks are IPv4), and everything
// except HostPrefixes is pure: the caller gathers what is already in use
// (HostPrefixes for the host's addresses and routes, plus every libvirt
// network, active or not, plus the workload cluster's pod and service
// CIDRs) and passes it in, so the decisions can be tested without touching
// the host.
package netalloc
