// Package virt is the provider's only door to libvirt: storage pools and
// volumes, NoCloud seed volumes, networks, domains, addresses, guest-agent
// commands and events. Controllers depend on the narrow Host interface and
// never on libvirt types, so they can be unit-tested against fakes.
//
// All XML is built from typed libvirtxml structs by pure functions that have
// golden-file tests; every libvirt object obtained is freed; every create is
// idempotent and every delete treats not-found as success.
package virt
