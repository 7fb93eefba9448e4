package fakehost

import (
	"context"
	"fmt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// notFaked is the error of a virt.Host method the fake does not model:
// the services' unit tests never call them, and a test that does fails
// with the method's name rather than a nil-pointer panic.
func (h *Host) notFaked(method string) error {
	_ = h.call(method)
	return fmt.Errorf("fakehost: %s is not faked (an integration test against libvirtd covers it)", method)
}

// DeleteNetwork is not faked: it fails, naming itself.
func (h *Host) DeleteNetwork(ctx context.Context, name string) error {
	return h.notFaked("DeleteNetwork")
}

// EnsureNetwork is not faked: it fails, naming itself.
func (h *Host) EnsureNetwork(ctx context.Context, spec virt.NetworkSpec) (virt.NetworkInfo, error) {
	return virt.NetworkInfo{}, h.notFaked("EnsureNetwork")
}

// GuestExec is not faked: it fails, naming itself.
func (h *Host) GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (virt.ExecResult, error) {
	return virt.ExecResult{}, h.notFaked("GuestExec")
}

// GuestInterfaces is not faked: it fails, naming itself.
func (h *Host) GuestInterfaces(ctx context.Context, domain string) ([]virt.GuestInterface, error) {
	return nil, h.notFaked("GuestInterfaces")
}

// ListOwned is not faked: it fails, naming itself.
func (h *Host) ListOwned(ctx context.Context) ([]virt.OwnedObject, error) {
	return nil, h.notFaked("ListOwned")
}

// UseBridge is not faked: it fails, naming itself.
func (h *Host) UseBridge(ctx context.Context, bridge string) (virt.NetworkInfo, error) {
	return virt.NetworkInfo{}, h.notFaked("UseBridge")
}

// UseNetwork is not faked: it fails, naming itself.
func (h *Host) UseNetwork(ctx context.Context, name string) (virt.NetworkInfo, error) {
	return virt.NetworkInfo{}, h.notFaked("UseNetwork")
}
