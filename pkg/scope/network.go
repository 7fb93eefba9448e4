package scope

import "strings"

// NetworkRef is the network a machine's NIC joins: a libvirt network
// (Name) or a host bridge (Bridge).
type NetworkRef struct {
	Name   string
	Bridge string
}

// IsZero tells whether no network is known.
func (n NetworkRef) IsZero() bool { return n.Name == "" && n.Bridge == "" }

// String is the NetworkAnnotation value of n: "network:<name>",
// "bridge:<bridge>", or "" when none is known.
func (n NetworkRef) String() string {
	if n.Name != "" {
		return "network:" + n.Name
	}
	if n.Bridge != "" {
		return "bridge:" + n.Bridge
	}
	return ""
}

// ParseNetworkRef reads a NetworkAnnotation value; zero when it is none.
func ParseNetworkRef(s string) NetworkRef {
	if v, ok := strings.CutPrefix(s, "network:"); ok {
		return NetworkRef{Name: v}
	}
	if v, ok := strings.CutPrefix(s, "bridge:"); ok {
		return NetworkRef{Bridge: v}
	}
	return NetworkRef{}
}
