package fakehost

import (
	"context"
	"os"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The fake of virt.GuestHost: the guest agent.
var _ virt.GuestHost = (*Host)(nil)

// GuestReadFile returns Files[domain:path].
func (h *Host) GuestReadFile(_ context.Context, domain, path string) ([]byte, error) {
	if err := h.call("GuestReadFile"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	data, ok := h.Files[domain+":"+path]
	if !ok {
		return nil, notFound("guest file " + path)
	}
	return data, nil
}

// GuestWriteFile is not used by the machine services.
func (h *Host) GuestWriteFile(context.Context, string, string, []byte, os.FileMode) error {
	return h.call("GuestWriteFile")
}
