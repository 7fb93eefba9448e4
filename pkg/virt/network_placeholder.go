package virt

// NetworkHost is a placeholder until the network part of the engine lands;
// its owner replaces this file with the real interface in network.go.
type NetworkHost interface{}
