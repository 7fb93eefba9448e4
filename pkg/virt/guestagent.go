package virt

import "net/netip"

// ExecResult is the outcome of a command run through the guest agent.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// GuestInterface is one network interface as the guest agent reports it.
type GuestInterface struct {
	Name string
	MAC  string
	// Addresses are the interface's addresses with their prefix lengths.
	Addresses []netip.Prefix
}
