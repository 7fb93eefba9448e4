package virt

import (
	"context"
	"errors"
	"os"
	"time"
)

// errNotImplemented marks methods still being written.
var errNotImplemented = errors.New("virt: not implemented yet")

// EnsurePool is being implemented.
func (c *Client) EnsurePool(ctx context.Context, spec PoolSpec) error { return errNotImplemented }

// ImportImage is being implemented.
func (c *Client) ImportImage(ctx context.Context, img ImageImport) (VolumeInfo, error) {
	return VolumeInfo{}, errNotImplemented
}

// EnsureOverlay is being implemented.
func (c *Client) EnsureOverlay(ctx context.Context, spec OverlaySpec) (VolumeInfo, error) {
	return VolumeInfo{}, errNotImplemented
}

// UploadVolume is being implemented.
func (c *Client) UploadVolume(ctx context.Context, pool, name string, data []byte) (VolumeInfo, error) {
	return VolumeInfo{}, errNotImplemented
}

// DeleteVolume is being implemented.
func (c *Client) DeleteVolume(ctx context.Context, pool, name string) error { return errNotImplemented }

// VolumeInfo is being implemented.
func (c *Client) VolumeInfo(ctx context.Context, pool, name string) (VolumeInfo, error) {
	return VolumeInfo{}, errNotImplemented
}

// EnsureDomain is being implemented.
func (c *Client) EnsureDomain(ctx context.Context, spec DomainSpec) (DomainInfo, error) {
	return DomainInfo{}, errNotImplemented
}

// StartDomain is being implemented.
func (c *Client) StartDomain(ctx context.Context, name string) error { return errNotImplemented }

// ShutdownDomain is being implemented.
func (c *Client) ShutdownDomain(ctx context.Context, name string, timeout time.Duration) error {
	return errNotImplemented
}

// DeleteDomain is being implemented.
func (c *Client) DeleteDomain(ctx context.Context, name string) error { return errNotImplemented }

// DomainInfo is being implemented.
func (c *Client) DomainInfo(ctx context.Context, name string) (DomainInfo, error) {
	return DomainInfo{}, errNotImplemented
}

// GuestExec is being implemented.
func (c *Client) GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (ExecResult, error) {
	return ExecResult{}, errNotImplemented
}

// GuestReadFile is being implemented.
func (c *Client) GuestReadFile(ctx context.Context, domain, path string) ([]byte, error) {
	return nil, errNotImplemented
}

// GuestWriteFile is being implemented.
func (c *Client) GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error {
	return errNotImplemented
}

// GuestInterfaces is being implemented.
func (c *Client) GuestInterfaces(ctx context.Context, domain string) ([]GuestInterface, error) {
	return nil, errNotImplemented
}

// ListOwned is being implemented.
func (c *Client) ListOwned(ctx context.Context) ([]OwnedObject, error) { return nil, errNotImplemented }
